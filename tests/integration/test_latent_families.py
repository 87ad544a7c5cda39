"""Helios (base, mid, distilled) and AnyFlow-FAR, offline on CPU with tiny random components
saved like real models: segments continued from persisted latents in other processes equal
one pipeline call of the whole length, the joins are as smooth as the inside of a segment,
a 4-segment chain goes through stitch, encode and QC, bad directories and segment lengths are
refused clearly, and one cached prompt embedding serves Wan and Helios."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from factory.errors import PermanentError
from factory.generate import SegmentSpec, segment_seed
from factory.generate.latent_backend import carry_from_bytes
from factory.manifest import ManifestError, parse_manifest
from factory.media.intermediate import read_frames
from factory.media.stitch import stitch
from factory.plan.segments import plan_segments
from factory.store import keys
from tests.conftest import REPO, run_cli_here
from tests.integration.test_diffusers import home_env, resumed_digests, run_chain
from tests.integration.test_redo import attempts_of
from tests.latent_segments import (
    JOB_SEED,
    NEGATIVE,
    OVERLAP,
    PROMPT,
    chunk_frames,
    loaded,
    segment_spec,
)
from tests.tiny_models import LATENT_SAVERS

VARIANTS = ["helios-base", "helios-mid", "helios-distilled", "anyflow-far"]


@pytest.fixture(scope="module")
def model_dirs(tiny_model) -> dict[str, Path]:
    return {name: tiny_model(name) for name in [*LATENT_SAVERS, "wan"]}


def family_of(variant: str) -> str:
    return "helios" if variant.startswith("helios") else "anyflow-far"


def segments_in_processes(variant: str, model_dir: Path, out: Path) -> list[np.ndarray]:
    """Segments 0-1 in one process, then a cold process resumes from the stored carry of
    segment 1 for segment 2, and another for segment 3: four segments, three processes."""
    out.mkdir(parents=True)
    for indices in ("0,1", "2", "3"):
        done = subprocess.run(
            [sys.executable, "-m", "tests.latent_segments", family_of(variant), str(model_dir),
             str(out), indices],
            cwd=REPO, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    return [np.load(out / f"frames-{k}.npy") for k in range(4)]


def new_latents(out: Path, variant: str) -> torch.Tensor:
    """Every segment's new latent frames, from the carries the processes stored."""
    new = chunk_frames(family_of(variant)) // 4
    parts = []
    for k in range(4):
        tensors, meta = carry_from_bytes((out / f"carry-{k}.safetensors").read_bytes())
        assert meta["segment"] == k and meta["generated"] == (k + 1) * new
        parts.append(tensors["latents"][:, :, -new:])
    return torch.cat(parts, 2)


def one_call(variant: str, generator) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """The whole length in one pipeline call, with the published arguments of the variant."""
    pipe = generator.pipe
    embeds = {k: v for k, v in generator.encode_prompt(PROMPT, NEGATIVE).data.items()}
    size = dict(height=64, width=128, output_type="latent")
    seeds = [segment_seed(JOB_SEED, k) for k in range(4)]
    if variant.startswith("helios"):
        chunk = dict(num_frames=4 * 33, generator=torch.Generator().manual_seed(seeds[0]), **size)
        if variant == "helios-base":
            return pipe(**embeds, num_inference_steps=2, guidance_scale=5.0, **chunk).frames
        if variant == "helios-mid":
            return pipe(**embeds, pyramid_num_inference_steps_list=[2, 2, 2], guidance_scale=5.0,
                        use_zero_init=True, zero_steps=1, **chunk).frames  # fmt: skip
        return pipe(**embeds, pyramid_num_inference_steps_list=[2, 2, 2], guidance_scale=1.0,
                    is_amplify_first_chunk=True, **chunk).frames  # fmt: skip
    # AnyFlow-FAR draws one channel-major noise tensor whose layout depends on the length: the
    # factory gives each segment its own noise, and the one call gets the same noise.
    noise = torch.cat([torch.randn((1, 16, 6, 8, 16), generator=torch.Generator().manual_seed(s))
                       for s in seeds], 2)  # fmt: skip
    return pipe(prompt_embeds=embeds["prompt_embeds"], latents=noise, num_frames=93,
                chunk_partition=[1, 3, 2] + [3] * 6, num_inference_steps=2, guidance_scale=1.0,
                **size).frames  # fmt: skip


@pytest.mark.parametrize("variant", VARIANTS)
def test_segments_in_other_processes_equal_one_pipeline_call(
    tmp_path: Path, model_dirs: dict[str, Path], variant: str
):
    frames = segments_in_processes(variant, model_dirs[variant], tmp_path / "run")
    generator = loaded(family_of(variant), str(model_dirs[variant]))
    whole = one_call(variant, generator)
    made = new_latents(tmp_path / "run", variant)
    assert made.shape == whole.shape and torch.equal(made, whole)  # bit for bit
    # The frames are the factory's warm decode of those latents, whoever made them.
    new = made.shape[2] // 4
    with torch.no_grad():
        for k in range(4):
            previous = whole[:, :, : k * new] if k else None
            decoded = generator._decode(segment_spec(family_of(variant), k), previous,
                                        whole[:, :, k * new : (k + 1) * new])  # fmt: skip
            expected = np.clip(np.rint(decoded * 255), 0, 255).astype(np.uint8)
            assert np.array_equal(frames[k], expected), f"segment {k}"


def test_past_the_window_the_context_slides_and_a_cold_resume_is_exact(
    tmp_path: Path, model_dirs: dict[str, Path]
):
    """A checkpoint tuned for 13 latent frames per call: later segments see only the last
    chunks that fit; the same frames come out whether or not the worker was cold."""
    model_dir = model_dirs["anyflow-far-window13"]
    frames = segments_in_processes("anyflow-far", model_dir, tmp_path / "cold")
    generator = loaded("anyflow-far", str(model_dir))
    prompt = generator.encode_prompt(PROMPT, NEGATIVE)
    carry = None
    for k in range(4):
        warm, carry = generator.generate_continuing(
            segment_spec("anyflow-far", k), prompt, carry, segment_seed(JOB_SEED, k)
        )
        assert np.array_equal(warm, frames[k]), f"segment {k}"
    tensors, _ = carry_from_bytes(carry)
    assert tensors["parts"].tolist() == [3, 3, 3, 3]  # the last whole chunks within 13


def frame_jumps(video: np.ndarray) -> np.ndarray:
    return np.abs(np.diff(video.astype(np.float32), axis=0)).mean(axis=(1, 2, 3))


@pytest.mark.parametrize("variant", ["helios-distilled", "anyflow-far"])
def test_joins_move_no_more_than_the_inside_of_a_segment(model_dirs: dict[str, Path], variant: str):
    """The factory's warm decode + cross-fade over the re-decoded overlap: the frame-to-frame
    change at a join is at most 1.2x the median inside segments. The pipelines' own decode,
    chunk by chunk, jumps far more at every chunk boundary (the seam Helios users see)."""
    family = family_of(variant)
    generator = loaded(family, str(model_dirs[variant]))
    prompt = generator.encode_prompt(PROMPT, NEGATIVE)
    new = chunk_frames(family)
    segments = 6
    plans = plan_segments(new * segments, new + OVERLAP, OVERLAP, (0,), OVERLAP)
    carry, tail, written, joins, latents = None, None, [], [], []
    for plan in plans:
        spec = segment_spec(family, plan.index)
        frames, carry = generator.generate_continuing(
            spec, prompt, carry, segment_seed(JOB_SEED, plan.index)
        )
        latents.append(carry_from_bytes(carry)[0]["latents"][:, :, -(new // 4) :])
        stitched = stitch(plan, frames, tail)
        tail = stitched.tail
        if plan.index:
            joins.append(sum(len(w) for w in written))
        written.append(stitched.frames)
    video = np.concatenate(written)
    assert len(video) == new * segments
    jumps = frame_jumps(video)
    at_joins = jumps[[j - 1 for j in joins]]
    inside = np.median(np.delete(jumps, [j - 1 for j in joins]))
    assert at_joins.max() <= 1.2 * inside, (at_joins, inside)
    # The same latents decoded chunk by chunk, as the pipelines do, jump at every boundary.
    chunk = generator.family.chunk_latents
    every = torch.cat(latents, 2)
    first = segment_spec(family, 0)
    hold = generator.time_stride - 1  # _decode holds a clip's first picture: drop the copies
    with torch.no_grad():
        pieces = [
            generator._decode(first, None, every[:, :, start : start + chunk])[hold:]
            for start in range(0, every.shape[2], chunk)
        ]
    native = frame_jumps(np.clip(np.rint(np.concatenate(pieces) * 255), 0, 255))
    bounds = [len(pieces[0]) * i - 1 for i in range(1, len(pieces))]
    native_inside = np.median(np.delete(native, bounds))
    assert native[bounds].mean() > 1.2 * native_inside, (native[bounds], native_inside)


def latent_manifest(model_dir: Path, variant: str, batch: str = "lat") -> str:
    family = family_of(variant)
    new = chunk_frames(family)
    return (
        f"batch: {batch}\nvideos:\n  - id: chain\n    duration: {4 * new / 24}\n    fps: 24\n"
        f"    resolution: 128x64\n    segment: {{frames: {new + OVERLAP}, overlap: {OVERLAP}}}\n"
        "    renditions: [mobile]\n    negative_prompt: blurry low quality flicker\n"
        f"    model: {{family: {family}, path: {model_dir}, steps: 2}}\n"
        "    scenes:\n      - {start: 0, prompt: 'a harbor at dawn with fog on the water'}\n"
        "      - {start: 1, prompt: 'boats leave the harbor and gulls fly'}\n"
    )


@pytest.mark.parametrize("variant", ["helios-distilled", "anyflow-far"])
def test_a_four_segment_chain_goes_through_stitch_encode_and_qc(
    tmp_path: Path, model_dirs: dict[str, Path], variant: str
):
    text = latent_manifest(model_dirs[variant], variant)
    factory, job, env = run_chain(tmp_path, text, "lat.chain")
    store = tmp_path / "home" / "store" / "lat" / "chain"
    assert (store / "out" / "mobile.mp4").is_file()
    carries = sorted(p.name for p in (store / "segments").glob("*.carry.safetensors"))
    assert len(carries) == 3  # every segment but the last leaves one
    seams = [r.seam for i, r in sorted(factory.jobs.segments(job.job_id).items()) if i]
    assert all(seam and seam["passed"] for seam in seams)
    done_events = [e for e in factory.jobs.events("lat.chain") if e.event == "segment.done"]
    assert all(e.detail["memory"]["device"] == "cpu" for e in done_events)
    report = json.loads(run_cli_here("gpu", "report", "--json", env=env).stdout)
    rows = report["segments"]  # segment 0 is shorter: a row of its own
    assert {r["family"] for r in rows} == {family_of(variant)}
    assert sum(r["segments"] for r in rows) == 4


def test_a_resumed_job_makes_the_same_frames_through_the_factory(
    tmp_path: Path, model_dirs: dict[str, Path]
):
    text = latent_manifest(model_dirs["helios-distilled"], "helios-distilled", batch="df")
    digests = resumed_digests(tmp_path, text)  # the cold worker continues the stored carry
    assert len(digests[0]) == 4 and digests[0] == digests[1]


@pytest.mark.parametrize("variant", ["helios-distilled", "anyflow-far"])
def test_a_cascade_redo_makes_the_range_and_every_segment_after_it_again(
    tmp_path: Path, model_dirs: dict[str, Path], variant: str
):
    """A latent family's next segment continues the previous one's latents, so a redo runs
    to the end of the video (`--cascade`); the first redone segment continues the stored
    carry of the one before, with the redo's seed: its noise must not be the chain's
    (Helios carries its noise generator's state, which would make version 1 again)."""
    path = tmp_path / "m.yaml"
    path.write_text(latent_manifest(model_dirs[variant], variant, batch="cas"))
    env = home_env(tmp_path / "home")
    done = run_cli_here("run", str(path), env=env, timeout=900)
    assert done.returncode == 0, done.stderr + done.stdout
    v1 = attempts_of(env, "cas.chain")
    duration = 4 * chunk_frames(family_of(variant)) / 24
    span = f"{0.6 * duration:.3f}-{0.65 * duration:.3f}"  # inside the third segment
    refused = run_cli_here("redo", "cas.chain", "--range", span, "--seed", "7", env=env)
    assert refused.returncode == 2 and "--cascade" in refused.stderr, refused.stderr
    plan = json.loads(run_cli_here("redo", "cas.chain", "--range", span, "--cascade",
                              "--dry-run", "--json", env=env).stdout)  # fmt: skip
    first = plan["segments"][0]
    assert first > 0 and plan["segments"] == list(range(first, 4)) and plan["join"] is None
    done = run_cli_here("redo", "cas.chain", "--range", span, "--cascade", "--seed", "7",
                   env=env, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "version 2 delivered" in done.stdout
    v2 = attempts_of(env, "cas.chain")
    assert {i for i in v2 if v2[i] != v1[i]} == set(plan["segments"])
    store = tmp_path / "home" / "store"

    def frames(index: int, attempt: int | None) -> np.ndarray:
        return read_frames(store / keys.segment("cas", "chain", index, attempt), 128, 64)

    for index in range(4):
        old, new = frames(index, v1[index]), frames(index, v2[index])
        if index < first:
            assert np.array_equal(old, new), index
        else:  # new noise: past the cross-fade from the segment before, other pictures
            changed = (old != new).any(axis=3).mean(axis=(1, 2))  # per frame
            assert changed[-len(changed) // 4 :].min() > 0.8, (index, changed.round(2))
    status = json.loads(run_cli_here("status", "cas.chain", "--json", env=env).stdout)
    assert status["progress"]["qc"]["passed"] is True
    assert status["version"] == 2


# -- refusals ------------------------------------------------------------------------------


def test_a_bad_segment_length_is_refused_naming_the_field(model_dirs: dict[str, Path]):
    text = latent_manifest(model_dirs["helios-distilled"], "helios-distilled").replace(
        "frames: 44", "frames: 41"
    )
    with pytest.raises(ManifestError) as caught:
        parse_manifest(text)
    message = str(caught.value)
    assert "segment.frames" in message and "whole chunks of 36 frames" in message
    far = latent_manifest(model_dirs["anyflow-far"], "anyflow-far").replace(
        "overlap: 8", "overlap: 16"
    )
    with pytest.raises(ManifestError, match=r"segment.overlap.*decoded again, at most 12"):
        parse_manifest(far)


def test_a_wrong_variant_or_a_missing_component_is_refused_clearly(
    tmp_path: Path, model_dirs: dict[str, Path]
):
    import shutil

    from factory.generate import make_generator
    from factory.spec import ModelChoice

    wan = model_dirs["wan"]
    with pytest.raises(PermanentError, match=r"not a Helios pipeline.*WanVACEPipeline"):
        make_generator(ModelChoice("helios", str(wan), steps=2)).load("cpu")
    broken = tmp_path / "broken"
    shutil.copytree(model_dirs["helios-distilled"], broken)
    index = json.loads((broken / "model_index.json").read_text())
    index["scheduler"] = ["diffusers", "HeliosScheduler"]
    (broken / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(PermanentError, match="is_distilled=True needs HeliosDMDScheduler"):
        make_generator(ModelChoice("helios", str(broken), steps=2)).load("cpu")
    missing = tmp_path / "missing"
    shutil.copytree(model_dirs["anyflow-far"], missing)
    shutil.rmtree(missing / "transformer")
    with pytest.raises(PermanentError, match="missing transformer"):
        make_generator(ModelChoice("anyflow-far", str(missing), steps=2)).load("cpu")
    # A checkpoint tuned for chunks of another size than the family's.
    odd = tmp_path / "odd"
    shutil.copytree(model_dirs["anyflow-far"], odd)
    config = json.loads((odd / "transformer" / "config.json").read_text())
    config["chunk_partition"] = [1, 2, 2, 2]
    (odd / "transformer" / "config.json").write_text(json.dumps(config))
    with pytest.raises(PermanentError, match="tuned for the chunk partition \\[1, 2, 2, 2\\]"):
        make_generator(ModelChoice("anyflow-far", str(odd), steps=2)).load("cpu")


def test_a_segment_without_its_carry_is_refused(model_dirs: dict[str, Path]):
    generator = loaded("helios", str(model_dirs["helios-distilled"]))
    prompt = generator.encode_prompt(PROMPT, NEGATIVE)
    with pytest.raises(PermanentError, match="segment 1 has no carry"):
        generator.generate_continuing(segment_spec("helios", 1), prompt, None, 1)
    _, carry = generator.generate_continuing(segment_spec("helios", 0), prompt, None, 1)
    _, carry1 = generator.generate_continuing(segment_spec("helios", 1), prompt, carry, 2)
    with pytest.raises(PermanentError, match="segment 1's, not segment 2's"):
        generator.generate_continuing(segment_spec("helios", 3), prompt, carry1, 3)
    with pytest.raises(PermanentError, match="not whole chunks of 36"):
        generator.generate_continuing(SegmentSpec(1, 40, 128, 64, 24, 36, 8), prompt, carry, 2)


# -- the embedding cache -------------------------------------------------------------------


def test_one_cached_embedding_serves_wan_and_helios(tmp_path: Path, model_dirs: dict[str, Path]):
    wan = model_dirs["wan"]
    helios = model_dirs["helios-distilled"]
    env = home_env(tmp_path / "home")
    wan_manifest = tmp_path / "wan.yaml"
    wan_manifest.write_text(
        latent_manifest(helios, "helios-distilled", batch="w")
        .replace("family: helios", "family: wan")
        .replace(str(helios), str(wan))
        .replace("frames: 44, overlap: 8", "frames: 17, overlap: 5")
        .replace("128x64", "64x64")
    )
    first = run_cli_here("preload", str(wan_manifest), env=env, timeout=300)
    assert first.returncode == 0, first.stderr
    assert "2 prompts, 0 already cached, 2 encoded" in first.stdout
    helios_manifest = tmp_path / "helios.yaml"
    helios_manifest.write_text(latent_manifest(helios, "helios-distilled", batch="h"))
    second_run = run_cli_here("preload", str(helios_manifest), "--json", env=env)
    assert second_run.returncode == 0, second_run.stderr
    second = json.loads(second_run.stdout)
    assert (second["embeddings"]["hits"], second["embeddings"]["misses"]) == (2, 0)
    # Sharing is right: Helios's own encode_prompt gives the very same tensors as Wan's.
    from factory.generate.text_encoding import TextEncoder
    from factory.spec import ModelChoice

    tensors = []
    for family, path in (("wan", wan), ("helios", helios)):
        encoder = TextEncoder(ModelChoice(family, str(path)))
        encoder.load("cpu")
        tensors.append(encoder.encode(PROMPT, NEGATIVE))
        assert encoder._loaded().__class__.__name__.startswith(
            "Wan" if family == "wan" else "Helios"
        )
    assert tensors[0].keys() == tensors[1].keys()
    assert all(torch.equal(tensors[0][k], tensors[1][k]) for k in tensors[0])


def test_validate_checks_the_helios_variant_and_its_sizes(
    tmp_path: Path, model_dirs: dict[str, Path]
):
    env = home_env(tmp_path / "home")
    path = tmp_path / "m.yaml"
    path.write_text(
        latent_manifest(model_dirs["helios-distilled"], "helios-distilled").replace(
            "128x64", "832x480"
        )
    )
    done = run_cli_here("validate", str(path), env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "videos[0].resolution: 832x480 does not suit Helios distilled (pyramid)" in (
        done.stderr + done.stdout
    )
    path.write_text(latent_manifest(model_dirs["helios-base"], "helios-base").replace(
        "128x64", "832x480"))  # fmt: skip
    assert run_cli_here("validate", str(path), env=env).returncode == 0  # base has no pyramid
    wan = model_dirs["wan"]
    path.write_text(latent_manifest(wan, "helios-base"))
    refused = run_cli_here("validate", str(path), env=env)
    assert refused.returncode == 2
    assert (
        "videos[0].model.path: not a Helios pipeline: model_index.json names WanVACEPipeline"
        in refused.stderr
    )
