"""A redo that changes a join between shots (`factory redo JOB --join 1=dissolve:1`), through
the whole embedded pipeline with real ffmpeg: a cut becomes a dissolve and a dissolve a cut
from the frames already made (no segment is generated again, every segment record is as it
was), only the chunks that start those shots are encoded again, the new version's gate
judges each join as what it now is, the delivered frames are the blend (or the cut) of the
lossless frames, the version before stays as it was, and a remake from nothing keeps the
changed joins. Every refusal names --join and changes nothing."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from factory.errors import FactoryError
from factory.job import Job
from factory.manifest import parse_manifest
from factory.media.analyze import Reference, analyze
from factory.media.intermediate import write_segment
from factory.media.splice import keyframe_frames
from factory.ops import Operations
from factory.ops.submit import submit
from factory.pipeline.runner import run_job
from factory.plan.video import video_shots
from factory.stages import Stage
from factory.store import keys
from tests.conftest import run_cli_here
from tests.integration.test_pipeline import home_env, in_process
from tests.integration.test_shots import FPS, MANIFEST, decoded, shot_streams


def segment_rows(ctx, job_id: str) -> dict[int, tuple]:
    return {i: (r.attempt, r.seconds) for i, r in ctx.machine.segments(job_id).items()}


def chunk_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if "chunks" in p.parts}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def qc_cuts(ctx, version: int) -> list[dict]:
    return json.loads(ctx.store.path(keys.qc_report("shots", "v", version)).read_text())["cuts"]


def delivered(home: Path) -> tuple[Any, Operations, Job]:
    """The shots video (a cut, then a dissolve) made and delivered as version 1 in HOME."""
    factory, ctx = in_process(home)
    ops = Operations(factory, dispatcher=lambda found: None)
    job = submit(parse_manifest(MANIFEST), factory.jobs, None).jobs[0]
    job = run_job(ctx, job.job_id, worker="t")
    assert job.stage is Stage.DONE, job.last_error
    return ctx, ops, job


def test_a_redo_turns_a_cut_into_a_dissolve_and_a_dissolve_into_a_cut(tmp_path: Path):
    ctx, ops, job = delivered(tmp_path / "home")
    cut, dissolve = (shot.start for shot in video_shots(job.video)[1:])
    root = ctx.store.root
    v1 = {r: ctx.store.path(keys.output("shots", "v", r, 1)) for r in job.video.renditions}
    v1_digests = {r: digest(p) for r, p in v1.items()}
    rows, chunks_before = segment_rows(ctx, job.job_id), chunk_files(root)

    # Refused, each naming --join, and nothing changes.
    refusals = {
        ("1=continue",): "would make the shot again",
        ("0=cut",): "continues the shot before",
        ("7=cut",): "the video has scenes 0-2",
        ("1=dissolve:2",): "ran on 12 frames",  # only 1 s was made past the cut
        ("1=cut",): "already joins by cut",
        ("2=spin:1",): "not a join a redo can give",
        ("1=dissolve",): "give the transition's length",
        ("1=cut", "1=dissolve:1"): "given once",
    }
    for texts, said in refusals.items():
        with pytest.raises(FactoryError, match=said) as caught:
            ops.redo(job.job_id, range_text=None, joins=list(texts), actor="test")
        assert caught.value.field == "--join", texts
    with pytest.raises(FactoryError, match="without --range"):
        ops.redo(job.job_id, range_text="1-2", joins=["1=dissolve:1"], actor="test")
    with pytest.raises(FactoryError, match="nothing to apply to") as caught:
        ops.redo(job.job_id, range_text=None, joins=["1=dissolve:1"], actor="test", seed=4)
    assert caught.value.field == "--seed"
    same = ops.job(job.job_id)
    assert (same.stage, same.attempt, same.progress.get("joins")) == (Stage.DONE, job.attempt, None)

    # The plan: no segment, the two chunks that start shots 1 and 2.
    env = home_env(tmp_path / "home")
    shown = run_cli_here("redo", job.job_id, "--join", "1=dissolve:1", "--join", "2=cut",
                         "--dry-run", env=env)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "scene 1 (frame 30): cut -> dissolve 1 s" in shown.stdout
    assert "scene 2 (frame 60): dissolve 1 s -> cut" in shown.stdout
    assert "none made again" in shown.stdout
    plan, started = ops.redo(job.job_id, range_text=None, joins=["1=dissolve:1", "2=cut"],
                             actor="test", reason="the director's cut")  # fmt: skip
    assert plan.segments == () and plan.gpu_seconds == 0 and len(plan.chunks) == 2
    assert started.stage is Stage.ENCODE  # nothing to generate
    job = ops.run_here(job.job_id, "test")
    assert job.stage is Stage.DONE and job.version == 2, job.last_error

    # Nothing generated: every segment record as it was; two chunks per rendition encoded.
    assert segment_rows(ctx, job.job_id) == rows
    new_chunks = chunk_files(root) - chunks_before
    encoded = sorted(c for c in new_chunks if "/qc/" not in c)
    measured = {Path(c).stem for c in new_chunks if "/qc/" in c}  # the gate's, per chunk
    assert len(encoded) == 2 * len(job.video.renditions), encoded
    assert {c.split("/")[-1][:5] for c in encoded} == {f"{i:05d}" for i in plan.chunks}
    assert len(measured) == 2, measured
    # The version before is untouched; the new one's gate judged the joins as they now are.
    assert {r: digest(p) for r, p in v1.items()} == v1_digests
    [first, second] = qc_cuts(ctx, 2)
    assert first["transition"] == "dissolve" and first["frame"] == cut and first["passed"]
    assert first["frames"] == FPS and first["psnr_y"] >= 38
    assert "transition" not in second and second["frame"] == dissolve and second["passed"]
    assert [c.get("transition") for c in qc_cuts(ctx, 1)] == [None, "dissolve"]

    # The delivered frames: the dissolve blends shot 0's run-on into shot 1, then a cut.
    streams = shot_streams(ctx, job)
    expected = []
    for n in range(job.video.frames_total):
        if cut <= n < cut + FPS:
            share = 1 - (n - cut) / FPS
            blend = streams[0][n] * share + streams[1][n] * (1 - share)
            expected.append(np.clip(np.rint(blend), 0, 255).astype(np.uint8))
        else:
            expected.append(streams[0 if n < cut else 1 if n < dissolve else 2][n])
    write_segment(tmp_path / "expected.mkv", np.stack(expected), FPS)
    v2 = {r: ctx.store.path(keys.output("shots", "v", r, 2)) for r in job.video.renditions}
    reference = Reference([(tmp_path / "expected.mkv", None)], 320, 192)
    measured = analyze(v2, FPS, job.video.frames_total / FPS, reference=reference,
                       work=tmp_path / "analysis", use_vmaf=False)  # fmt: skip
    for rendition, result in measured.items():
        psnr = result.per_frame["psnr_y"]
        assert len(psnr) == len(decoded(v2[rendition])) == job.video.frames_total
        assert min(psnr[cut : cut + FPS]) >= 40, (rendition, psnr[cut : cut + FPS])
        assert min(psnr) >= 38, rendition
        assert {0, cut, dissolve} <= set(keyframe_frames(v2[rendition], FPS)), rendition

    # The version's record and the job's events say what changed and who asked.
    view = ops.job_view(job.job_id)
    record = next(v for v in view.versions if v.version == 2)
    assert [j["to"] for j in record.detail["joins"]] == ["dissolve 1 s", "cut"]
    status = run_cli_here("status", job.job_id, env=env)
    assert status.returncode == 0, status.stderr
    assert "joins changed: scene 1 cut -> dissolve 1 s, scene 2 dissolve 1 s -> cut" in (
        status.stdout
    )

    # Made again from nothing, the video keeps the joins its current version has.
    ops.requeue(job.job_id, from_stage=Stage.GENERATE, actor="test")
    job = ops.run_here(job.job_id, "test")
    assert job.stage is Stage.DONE and job.version == 3, job.last_error
    assert [c.get("transition") for c in qc_cuts(ctx, 3)] == ["dissolve", None]


def test_a_cancelled_join_change_puts_the_joins_back(tmp_path: Path):
    _, ops, job = delivered(tmp_path / "home")
    ops.redo(job.job_id, range_text=None, joins=["2=wipe-left:0.5"], actor="test")
    cancelled = ops.cancel(job.job_id, reason="not this one", actor="test")
    assert cancelled.stage is Stage.DONE and cancelled.version == 1
    assert "joins" not in cancelled.progress
    assert [shot.join.kind for shot in video_shots(cancelled.video)] == [
        "continue", "cut", "dissolve"
    ]  # fmt: skip
