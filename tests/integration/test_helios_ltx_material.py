"""A scene's first frame reaches Helios and AnyFlow-FAR, and a camera move reaches LTX-Video
(issue 38): tiny random-weight pipelines built from config, driven through the embedded
segment path (two shots, a cut between, two segments each), each pipeline call recorded.

- Helios: the segment that starts a shot from a picture gets the picture as Helios's own
  image-to-video makes it (`image_latents` and `fake_image_latents`: its call gives the very
  latents a `pipe(image=picture)` call of the same seed gives, on the picture as the factory
  fits it); the shot's later segments keep that picture's latent as their anchor; a shot
  without a picture is called with exactly the arguments it had before pictures existed.
- AnyFlow-FAR: the picture as a 1-frame `video=` context (its image-to-video), at the start
  of its shot only.
- LTX-Video: every segment of the scene with a camera move gets the template's frames as a
  video condition at frame 0 of the move's strength, before its tail (or its first picture)
  at strength 1; the scene without one gets exactly its old conditions.

A job resumed by a cold worker at its second segment makes every call the same."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from factory.generate import segment_seed
from factory.generate.diffusers_backend import frames_for_model
from factory.generate.latent_backend import HELIOS_HISTORY, _no_chunk_decode, carry_from_bytes
from factory.manifest import parse_manifest
from factory.media.images import load_image
from factory.plan.video import template_frames, video_plan
from tests.integration.test_camera import pan_template
from tests.integration.test_images import pictures
from tests.integration.test_images_diffusers import in_process, run_segments
from tests.latent_segments import JOB_SEED, NEGATIVE, PROMPT, loaded, segment_spec

MODELS = ("helios-base", "helios-distilled", "anyflow-far", "ltx-video")


@pytest.fixture(scope="module")
def model_dirs(tiny_model) -> dict[str, Path]:
    return {name: tiny_model(name) for name in MODELS}


def spy(monkeypatch, name: str) -> tuple[list[dict[str, Any]], Any]:
    """Record every call of the diffusers pipeline NAME: the pipeline, what it was given and
    what it gave back; and the real `__call__`, to call it again unrecorded."""
    import diffusers

    cls = getattr(diffusers, name)
    real = cls.__call__
    calls: list[dict[str, Any]] = []

    def call(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = real(self, *args, **kwargs)
        calls.append({"pipe": self, "kwargs": kwargs, "frames": out.frames})
        return out

    monkeypatch.setattr(cls, "__call__", call)
    return calls, real


def digest(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        data = value.detach().cpu().contiguous().numpy().tobytes()
    elif isinstance(value, list):  # pictures
        data = b"".join(np.asarray(p.convert("RGB")).tobytes() for p in value)
    else:
        data = np.asarray(value.convert("RGB")).tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def manifest(family: str, model_dir: Path, segment: str, size: str, duration: float,
             fps: int, first: str, second: str) -> str:  # fmt: skip
    return (
        "batch: mat\nvideos:\n  - id: v\n"
        f"    duration: {duration}\n    fps: {fps}\n    resolution: {size}\n"
        f"    segment: {segment}\n    renditions: [mobile]\n    run_on: 0\n"
        f"    model: {{family: {family}, path: {model_dir}, steps: 2}}\n"
        "    scenes:\n"
        f"      - {{start: 0, prompt: 'a bottle on a table'{first}}}\n"
        f"      - {{start: {duration / 2}, prompt: 'a red room', join: cut{second}}}\n"
    )


def both_runs(tmp_path: Path, text: str, calls: list[dict[str, Any]], summary) -> list:  # type: ignore[no-untyped-def]
    """The job made by one worker, then again with a cold worker taking over at its second
    segment: the calls of the first run (the same, call for call, in both)."""
    pictures(tmp_path)
    pan_template(tmp_path / "pan.mkv")
    run_segments(tmp_path / "whole", text, tmp_path, crash_at=None)
    whole = list(calls)
    calls.clear()
    run_segments(tmp_path / "resumed", text, tmp_path, crash_at=1)
    assert [summary(c) for c in calls] == [summary(c) for c in whole]
    return whole


# -- Helios --------------------------------------------------------------------------------

HELIOS_PICTURE = {"image_latents", "fake_image_latents", "add_noise_to_image_latents"}
# What a Helios distilled call was given before pictures existed: a shot's first segment,
# and a segment that continues the shot's carry.
HELIOS_START = {
    "prompt_embeds", "negative_prompt_embeds", "height", "width", "num_frames",
    "guidance_scale", "generator", "output_type", "history_sizes",
    "num_latent_frames_per_chunk", "keep_first_frame", "callback_on_step_end",
    "pyramid_num_inference_steps_list", "is_amplify_first_chunk",
}  # fmt: skip
HELIOS_CONTINUE = HELIOS_START | {
    "video_latents", "image_latents", "add_noise_to_video_latents", "add_noise_to_image_latents",
}  # fmt: skip


def helios_summary(call: dict[str, Any]) -> dict[str, Any]:
    kwargs = call["kwargs"]
    return {
        "keys": sorted(kwargs),
        **{name: digest(kwargs.get(name)) for name in ("image_latents", "fake_image_latents",
                                                        "video_latents")},
        "out": digest(call["frames"]),
    }  # fmt: skip


def test_helios_starts_a_shot_from_its_picture_and_keeps_it_as_the_anchor(
    tmp_path: Path, model_dirs: dict[str, Path], monkeypatch
):
    calls, real = spy(monkeypatch, "HeliosPyramidPipeline")
    text = manifest("helios", model_dirs["helios-distilled"], "{frames: 44, overlap: 8}",
                    "128x64", 6, 24, "", ", image: {asset: pics/red.jpg}")  # fmt: skip
    whole = both_runs(tmp_path, text, calls, helios_summary)
    video = parse_manifest(text).videos[0]
    plans = video_plan(video)
    assert [(p.shot, p.starts_shot) for p in plans] == [(0, True), (0, False), (1, True),
                                                       (1, False)]  # fmt: skip
    assert len(whole) == len(plans)  # one call per segment
    red = load_image(tmp_path / "red.jpg", 128, 64, "pad")  # the picture as the factory fits it
    first = None
    for plan, call in zip(plans, whole, strict=True):
        kwargs = call["kwargs"]
        if plan.shot == 0:  # no picture: the arguments (and their values) of before
            assert set(kwargs) == (HELIOS_START if plan.starts_shot else HELIOS_CONTINUE)
            assert kwargs["is_amplify_first_chunk"] is plan.starts_shot
            if not plan.starts_shot:
                assert kwargs["add_noise_to_image_latents"] is False
            continue
        if plan.starts_shot:
            assert set(kwargs) == HELIOS_START | HELIOS_PICTURE
            assert kwargs["add_noise_to_image_latents"] is False  # noised as `image=` does
            first = call
            # The call made exactly what Helios's own image-to-video makes of the picture.
            again = {k: v for k, v in kwargs.items() if k not in HELIOS_PICTURE}
            again.update(image=Image.fromarray(red),
                         generator=torch.Generator("cpu").manual_seed(
                             segment_seed(video.seed, plan.index)))  # fmt: skip
            with _no_chunk_decode(call["pipe"]):
                direct = real(call["pipe"], **again).frames
            assert torch.equal(direct, call["frames"])
            assert call["frames"].shape[2] == 1 + (plan.frames // 4)  # the held picture first
        else:  # the shot's picture stays the anchor; the history starts with it held
            assert first is not None and set(kwargs) == HELIOS_CONTINUE
            assert torch.equal(kwargs["image_latents"], first["kwargs"]["image_latents"])
            history = kwargs["video_latents"]  # all that the first call had: it fits
            assert history.shape[2] < sum(HELIOS_HISTORY)
            assert torch.equal(history[:, :, :1], first["kwargs"]["fake_image_latents"])
            assert torch.equal(history, first["frames"])


@pytest.mark.parametrize("variant", ["helios-base", "helios-distilled"])
def test_helios_segments_from_a_picture_equal_one_image_to_video_call(
    model_dirs: dict[str, Path], variant: str
):
    """Three segments of a shot that starts from a picture, the third made by a cold worker
    from the stored carry, are the latents of one `pipe(image=picture)` call of the whole
    length, bit for bit: the picture's latent is the anchor throughout, as in that call."""
    picture = (np.random.default_rng(3).random((64, 128, 3)) * 255).astype(np.uint8)
    specs = [segment_spec("helios", k) for k in range(3)]
    specs[0] = replace(specs[0], image=picture, image_role="first-frame")
    generator = loaded("helios", str(model_dirs[variant]))
    prompt = generator.encode_prompt(PROMPT, NEGATIVE)
    carry, made = None, []
    for k, spec in enumerate(specs):
        if k == 2:  # a cold worker
            generator = loaded("helios", str(model_dirs[variant]))
        _, carry = generator.generate_continuing(spec, prompt, carry, segment_seed(JOB_SEED, k))
        made.append(carry_from_bytes(carry)[0]["latents"][:, :, -9:])
    steps = (dict(num_inference_steps=2, guidance_scale=5.0) if variant == "helios-base" else
             dict(pyramid_num_inference_steps_list=[2, 2, 2], guidance_scale=1.0,
                  is_amplify_first_chunk=True))  # fmt: skip
    whole = generator.pipe(
        **prompt.data, image=Image.fromarray(picture), height=64, width=128, num_frames=3 * 33,
        output_type="latent", generator=torch.Generator().manual_seed(segment_seed(JOB_SEED, 0)),
        **steps,
    ).frames  # fmt: skip
    assert torch.equal(torch.cat(made, 2), whole[:, :, 1:])  # after the picture held


# -- AnyFlow-FAR ---------------------------------------------------------------------------


def far_summary(call: dict[str, Any]) -> dict[str, Any]:
    kwargs = call["kwargs"]
    return {
        "keys": sorted(kwargs),
        "video": digest(kwargs.get("video")),
        "context": digest(kwargs.get("video_latents")),
        "partition": kwargs["chunk_partition"],
        "out": digest(call["frames"]),
    }


def test_anyflow_far_starts_a_shot_from_its_picture_as_a_one_frame_context(
    tmp_path: Path, model_dirs: dict[str, Path], monkeypatch
):
    calls, _ = spy(monkeypatch, "AnyFlowFARPipeline")
    text = manifest("anyflow-far", model_dirs["anyflow-far"], "{frames: 32, overlap: 8}",
                    "128x64", 4, 24, "", ", image: {asset: pics/hero.png}")  # fmt: skip
    whole = both_runs(tmp_path, text, calls, far_summary)
    plans = video_plan(parse_manifest(text).videos[0])
    assert len(whole) == len(plans) == 4
    hero = load_image(tmp_path / "hero.png", 128, 64, "pad")
    for plan, call in zip(plans, whole, strict=True):
        kwargs = call["kwargs"]
        if plan.shot == 1 and plan.starts_shot:
            picture = kwargs["video"]  # (B, T, C, H, W) in 0..1: the picture, one frame
            assert picture.shape == (1, 1, 3, 64, 128)
            assert np.array_equal(np.rint(picture[0, 0].permute(1, 2, 0).numpy() * 255), hero)
            assert kwargs["video_latents"] is None and kwargs["chunk_partition"][0] == 1
            # The segment's first latent frame is the picture's (the pipeline's own encode).
            encoded = call["pipe"].encode_video(picture, 64, 128).permute(0, 2, 1, 3, 4)
            assert torch.equal(call["frames"][:, :, :1], encoded.to(call["frames"]))
        else:
            assert "video" not in kwargs  # as before pictures: no `video` argument at all


# -- LTX-Video -----------------------------------------------------------------------------


def ltx_summary(call: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [
        ("image", digest(c.image), c.frame_index, c.strength)
        if c.image is not None
        else ("video", digest(c.video), len(c.video), c.frame_index, c.strength)
        for c in call["kwargs"].get("conditions") or []
    ]


def test_ltx_follows_a_camera_move_as_a_video_condition_of_its_strength(
    tmp_path: Path, model_dirs: dict[str, Path], monkeypatch
):
    calls, _ = spy(monkeypatch, "LTXConditionPipeline")
    second = ", image: {asset: pics/red.jpg}, camera: {asset: moves/pan.mkv, strength: 0.7}"
    text = manifest("ltx-video", model_dirs["ltx-video"], "{frames: 25, overlap: 9}", "64x64",
                    4, 8, "", second)  # fmt: skip
    whole = both_runs(tmp_path, text, calls, ltx_summary)
    video = parse_manifest(text).videos[0]
    plans = video_plan(video)
    assert len(whole) == len(plans) and {p.shot for p in plans} == {0, 1}
    _, ctx = in_process(tmp_path / "whole")
    template = ctx.template("moves/pan.mkv", video)
    red = Image.fromarray(load_image(tmp_path / "red.jpg", 64, 64, "pad"))
    for plan, call in zip(plans, whole, strict=True):
        kwargs, conditions = call["kwargs"], ltx_summary(call)
        if plan.shot == 0:  # no camera move: the conditions of before, and no others
            if plan.starts_shot:
                assert "conditions" not in kwargs  # text to video
            else:
                assert conditions == [("video", conditions[0][1], plan.context, 0, 1.0)]
            continue
        # The template's frames where the segment's frames are in it, the last one held to the
        # model's 8k+1 frames, at frame 0, of the move's strength: first, then what it keeps.
        count = frames_for_model(plan.frames, 8)
        where = [round(p) for p in template_frames(video, plan, len(template.frames))]
        wanted = [Image.fromarray(f) for f in template.frames[where]]
        wanted += wanted[-1:] * (count - len(wanted))
        assert conditions[0] == ("video", digest(wanted), count, 0, 0.7), plan.index
        if plan.starts_shot:  # the shot's first picture, at strength 1
            assert conditions[1:] == [("image", digest(red), 0, 1.0)], plan.index
        else:  # the tail, at strength 1, as without a camera move
            assert len(conditions) == 2
            assert conditions[1][2:] == (plan.context, 0, 1.0), plan.index


def test_gpu_plan_counts_what_the_new_families_are_given():
    """`factory gpu plan --control` for LTX-Video counts its video condition's encode (the
    whole clip at once), `--first-frame` for Helios the picture held for a chunk too;
    SkyReels still cannot follow a camera move."""
    from factory.errors import BadInput
    from factory.generate.memory_plan import plan

    plain = plan("ltx-video", 768, 512, 121)
    moved = plan("ltx-video", 768, 512, 121, control=True)
    names = {line.component for line in moved.lines}
    assert "camera move (video condition, VAE encode)" in names
    assert moved.gpu_total > plain.gpu_total and moved.tokens == plain.tokens
    tiled = plan("ltx-video", 768, 512, 121, control=True, vae_tiling=True)
    assert tiled.gpu_total < moved.gpu_total
    helios = plan("helios", 640, 384, 152, first_frame=True)
    assert "first frame (VAE encode, held for a chunk)" in {line.component for line in helios.lines}
    assert (
        plan("anyflow-far", 832, 480, 56, first_frame=True).gpu_total
        > plan("anyflow-far", 832, 480, 56).gpu_total
    )
    with pytest.raises(BadInput, match="cannot follow a camera move"):
        plan("skyreels-v2-df", 832, 480, 97, control=True)
