"""A scene's picture and camera move reach the diffusers pipelines (issue 38, items 1 and 2):
tiny random-weight Wan VACE, SkyReels-V2 DF and LTX-Video pipelines, built from config,
driven through the embedded segment path (two or three segments, a cut between) with a
first frame (Wan VACE: a kept first frame; SkyReels: its image-to-video pipeline; LTX: a
condition at frame 0), a
reference picture (Wan VACE's reference images) and a camera move (Wan VACE's control frames
and conditioning scale). What each pipeline call received is recorded, segment by segment,
and a job resumed by a cold worker at its second segment gives every call exactly the same
pictures and control frames."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from factory.config import Settings
from factory.manifest import parse_manifest
from factory.media.images import load_image
from factory.ops.submit import submit
from factory.pipeline.context import StageContext
from factory.pipeline.generate import generate_segment
from factory.plan.video import next_segment, video_plan
from factory.wiring import Factory
from tests.conftest import embedded_env
from tests.integration.test_camera import pan_template
from tests.integration.test_images import pictures

# The pipelines a segment may call, per family, and where the picture goes in each call.
PIPELINES = {
    "wan": ("WanVACEPipeline",),
    "skyreels-v2-df": (
        "SkyReelsV2DiffusionForcingPipeline",
        "SkyReelsV2DiffusionForcingVideoToVideoPipeline",
        "SkyReelsV2DiffusionForcingImageToVideoPipeline",
    ),
    "ltx-video": ("LTXConditionPipeline",),
}
SEGMENTS = {"ltx-video": "{frames: 25, overlap: 9}"}  # (LTX's VAE: 8k+1 frames)
SIZE = 64
# Random weights make noise with no continuity: seams never pass, and a regeneration would
# be one more pipeline call per segment; this test is about what each call is given.
LOOSE_SEAMS = {
    name: "1000"
    for name in (
        "FACTORY_QC_SEAM_JUMP",
        "FACTORY_QC_SEAM_DELTA_E",
        "FACTORY_QC_SEAM_DELTA_L",
        "FACTORY_QC_SEAM_SSIM_DROP",
    )
}


@pytest.fixture(scope="module")
def model_dirs(tiny_model) -> dict[str, Path]:
    return {family: tiny_model(family) for family in PIPELINES}


def in_process(home: Path) -> tuple[Factory, StageContext]:
    settings = Settings.from_env({**embedded_env(home), **LOOSE_SEAMS})
    factory = Factory.open(settings)
    return factory, StageContext.from_settings(settings, factory.jobs, factory.database)


def digest(picture: Any) -> str:
    return hashlib.sha256(np.asarray(picture.convert("RGB")).tobytes()).hexdigest()[:16]


def spy(monkeypatch, family: str) -> list[dict[str, Any]]:
    """Record what each pipeline call is given: its class, the picture it starts from (a
    first frame: `image`, or VACE's first kept frame when its mask keeps only that one),
    its reference images, and how many frames it keeps."""
    import diffusers

    calls: list[dict[str, Any]] = []
    for name in PIPELINES[family]:
        cls = getattr(diffusers, name)
        real = cls.__call__

        def call(self, *args, _real=real, _name=name, **kwargs):  # type: ignore[no-untyped-def]
            mask = kwargs.get("mask")
            kept = sum(1 for m in mask if np.asarray(m).max() == 0) if mask else 0
            start = kwargs.get("image")
            if start is None and kept == 1 and kwargs.get("video"):
                start = kwargs["video"][0]
            for condition in kwargs.get("conditions") or []:  # LTX: a picture at frame 0
                if getattr(condition, "image", None) is not None:
                    start = condition.image
            video = kwargs.get("video") or []
            calls.append({
                "pipeline": _name,
                "start": digest(start) if start is not None else None,
                "references": [digest(p) for p in kwargs.get("reference_images") or []],
                "kept": kept or len(video),
                # a camera move: VACE's control frames (those it generates) and their weight
                "control": hashlib.sha256(b"".join(np.asarray(f).tobytes()
                                                   for f in video[kept:])).hexdigest()[:16]
                if mask and kwargs.get("conditioning_scale") is not None else None,
                "scale": kwargs.get("conditioning_scale"),
            })  # fmt: skip
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__call__", call)
    return calls


def manifest(model_dir: Path, family: str) -> str:
    # Wan VACE: the second shot has a reference picture and follows a camera move too.
    second = ("as: reference}, camera: {asset: moves/pan.mkv, strength: 0.7"
              if family == "wan" else "as: first-frame")  # fmt: skip
    return (
        "batch: dfpics\nvideos:\n  - id: chain\n    duration: 4\n    fps: 8\n"
        f"    resolution: {SIZE}x{SIZE}\n"
        f"    segment: {SEGMENTS.get(family, '{frames: 17, overlap: 5}')}\n"
        "    renditions: [mobile]\n"
        f"    model: {{family: {family}, path: {model_dir}, steps: 2, guidance: 6.0}}\n"
        "    scenes:\n"
        "      - {start: 0, prompt: 'a bottle on a table', image: {asset: pics/hero.png}}\n"
        "      - {start: 2, prompt: 'a red room', join: cut, "
        f"image: {{asset: pics/red.jpg, {second}}}}}\n"
    )


def run_segments(home: Path, text: str, folder: Path, crash_at: int | None) -> None:
    factory, ctx = in_process(home)
    for name in ("hero.png", "red.jpg"):
        ctx.store.put_file(f"pics/{name}", folder / name)
    ctx.store.put_file("moves/pan.mkv", folder / "pan.mkv")
    job = submit(parse_manifest(text), factory.jobs, None).jobs[0]
    job = factory.jobs.claim(job.job_id, seen_attempt=job.attempt, worker="a")
    warm, made = None, 0
    while next_segment(job) is not None:
        if made == crash_at:  # a cold worker takes over: a new generator, no warm tail
            _, ctx = in_process(home)
            job = factory.jobs.claim(job.job_id, seen_attempt=job.attempt, worker="b")
            warm = None
        job, warm = generate_segment(ctx, job, warm)
        made += 1


@pytest.mark.parametrize("family", list(PIPELINES))
def test_pictures_reach_the_pipeline_and_a_resumed_job_gives_the_same(
    tmp_path: Path,
    model_dirs: dict[str, Path],
    family: str,
    monkeypatch,
):
    pictures(tmp_path)
    pan_template(tmp_path / "pan.mkv")
    text = manifest(model_dirs[family], family)
    calls = spy(monkeypatch, family)
    run_segments(tmp_path / "whole", text, tmp_path, crash_at=None)
    whole = list(calls)
    calls.clear()
    run_segments(tmp_path / "resumed", text, tmp_path, crash_at=1)
    assert calls == whole  # the same pictures, call for call, across the takeover

    hero = digest(Image.fromarray(load_image(tmp_path / "hero.png", SIZE, SIZE, "pad")))
    red = digest(Image.fromarray(load_image(tmp_path / "red.jpg", SIZE, SIZE, "pad")))
    video = parse_manifest(text).videos[0]
    plans = video_plan(video)
    assert len(whole) == len(plans)  # one call per segment
    by_scene = {p.index: video.scenes[p.scene] for p in plans}
    for plan, call in zip(plans, whole, strict=True):
        scene = by_scene[plan.index]
        if plan.starts_shot and scene.image.role == "first-frame":
            picture = hero if plan.shot == 0 else red
            assert call["start"] == picture, (plan.index, call)
            if family == "skyreels-v2-df":
                assert call["pipeline"].endswith("ImageToVideoPipeline")
            if family == "ltx-video":  # a condition of the picture at frame 0, nothing else
                assert call["pipeline"] == "LTXConditionPipeline"
        else:
            assert call["start"] is None, (plan.index, call)
        if family == "wan":
            # the scene's picture as a reference: scene 1's own, and scene 0's first frame for
            # the later segments of its scene; scene 1 follows the camera move at 0.7
            wanted = [red] if plan.shot == 1 else ([] if plan.starts_shot else [hero])
            assert call["references"] == wanted, (plan.index, call)
            moved = (0.7, True) if plan.shot == 1 else (None, False)
            assert (call["scale"], call["control"] is not None) == moved, (plan.index, call)
        else:
            assert call["references"] == [] and call["scale"] is None
