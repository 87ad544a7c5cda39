"""Shots joined by a cut and a dissolve, through the whole embedded pipeline with real ffmpeg:
every delivered frame once, each cut and transition a keyframe in every rendition, the
dissolve's delivered frames the blend of the two shots' lossless frames, the gate judging
the cut as a cut (and failing one smeared by a half-blended frame), and `factory validate`
listing the shots."""

from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np

from factory.manifest import parse_manifest
from factory.media.analyze import Reference, analyze
from factory.media.intermediate import read_frames, write_segment
from factory.media.splice import keyframe_frames
from factory.ops.submit import submit
from factory.pipeline.files import Segments
from factory.pipeline.generate import run_generate
from factory.pipeline.runner import run_job
from factory.plan.video import video_plan, video_shots
from factory.stages import Stage
from factory.store import keys
from tests.conftest import run_cli_here
from tests.integration.test_pipeline import home_env, in_process, write_manifest

FPS = 12
MANIFEST = f"""batch: shots
videos:
  - id: v
    duration: 8
    fps: {FPS}
    resolution: 320x192
    segment: {{frames: 24, overlap: 4}}
    seed: 3
    scenes:
      - {{start: 0, prompt: a red fox in deep snow}}
      - {{start: 2.5, prompt: a blue harbour at dusk, join: cut}}
      - {{start: 5, prompt: a green forest in rain, join: {{transition: dissolve, seconds: 1}}}}
"""


def luma(frames: np.ndarray) -> np.ndarray:
    f = frames.astype(np.float64)
    return 0.299 * f[..., 0] + 0.587 * f[..., 1] + 0.114 * f[..., 2]


def psnr_y(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((luma(a) - luma(b)) ** 2))
    return 99.0 if mse == 0 else 10 * np.log10(255**2 / mse)


def decoded(path: Path) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def shot_streams(ctx, job) -> dict[int, dict[int, np.ndarray]]:
    """Each shot's lossless frames by their number in the video (run-on included)."""
    made, video = Segments.load(ctx.machine, job), job.video
    streams: dict[int, dict[int, np.ndarray]] = {}
    for plan in video_plan(video):
        with ctx.store.local_path(made.segment(plan.index)) as path:
            frames = read_frames(path, video.width, video.height)
        assert len(frames) == plan.write_count
        for i, frame in enumerate(frames):
            streams.setdefault(plan.shot, {})[plan.write_start + i] = frame
    return streams


def test_a_cut_and_a_dissolve_delivered_frame_for_frame(tmp_path: Path):
    factory, ctx = in_process(tmp_path / "home")
    job = submit(parse_manifest(MANIFEST), factory.jobs, None).jobs[0]
    job = run_job(ctx, job.job_id, worker="t")
    assert job.stage is Stage.DONE, job.last_error
    video = job.video
    cut, dissolve = (shot.start for shot in video_shots(video)[1:])
    assert (cut, dissolve) == (30, 60)
    report = json.loads(ctx.store.path(keys.qc_report("shots", "v")).read_text())
    assert report["passed"], report["failures"]
    [judged_cut, judged_dissolve] = report["cuts"]
    assert judged_cut["frame"] == cut and judged_cut["passed"] and judged_cut["blend"] > 0.2
    assert judged_dissolve["transition"] == "dissolve" and judged_dissolve["frames"] == FPS
    assert judged_dissolve["passed"] and judged_dissolve["psnr_y"] >= 38

    streams = shot_streams(ctx, job)
    assert max(streams[1]) == dissolve + FPS - 1  # the middle shot ran on through the dissolve
    # What should be delivered, from the lossless segments alone: each frame from the shot
    # that owns it, the dissolve's the blend of both (outgoing * (1 - i/T) + incoming * i/T).
    expected = []
    for n in range(video.frames_total):
        if dissolve <= n < dissolve + FPS:
            share = 1 - (n - dissolve) / FPS  # the outgoing shot's
            blend = streams[1][n] * share + streams[2][n] * (1 - share)
            expected.append(np.clip(np.rint(blend), 0, 255).astype(np.uint8))
        else:
            expected.append(streams[0 if n < cut else 1 if n < dissolve else 2][n])
    write_segment(tmp_path / "expected.mkv", np.stack(expected), FPS)
    outputs = {r: ctx.store.path(keys.output("shots", "v", r)) for r in video.renditions}
    for rendition, out in outputs.items():
        keyframes = set(keyframe_frames(out, FPS))
        assert {0, cut, dissolve} <= keyframes, (rendition, sorted(keyframes))
        assert len(decoded(out)) == video.frames_total  # every delivered frame, once
    reference = Reference([(tmp_path / "expected.mkv", None)], video.width, video.height)
    measured = analyze(outputs, FPS, video.frames_total / FPS, reference=reference,
                       work=tmp_path / "analysis", use_vmaf=False)  # fmt: skip
    for rendition, result in measured.items():
        psnr = result.per_frame["psnr_y"]
        assert len(psnr) == video.frames_total
        in_dissolve = psnr[dissolve : dissolve + FPS]
        assert min(in_dissolve) >= 40, (rendition, [round(v, 1) for v in in_dissolve])
        assert min(psnr) >= 38, (rendition, [round(v, 1) for v in psnr])  # frame for frame
    # the blend is not either shot alone: its middle frames are far from both
    master = decoded(outputs["master"])
    middle = dissolve + FPS // 2
    assert psnr_y(master[middle], expected[middle]) > 6 + max(
        psnr_y(master[middle], streams[1][middle]), psnr_y(master[middle], streams[2][middle])
    )
    sheet = ctx.store.path(job.progress["qc"]["pictures"]["contact"])
    assert sheet.stat().st_size > 0


def test_a_cut_smeared_by_a_half_blended_frame_fails_the_gate(tmp_path: Path):
    factory, ctx = in_process(tmp_path / "home")
    job = submit(parse_manifest(MANIFEST), factory.jobs, None).jobs[0]
    job = ctx.machine.claim(job.job_id, seen_attempt=job.attempt, worker="t")
    job = run_generate(ctx, job)  # no chunk encoded yet: the smear is in what gets encoded
    made, video = Segments.load(ctx.machine, job), job.video
    first_after = next(p for p in video_plan(video) if p.shot == 1 and p.starts_shot)
    key = made.segment(first_after.index)
    before = read_frames(ctx.store.path(made.segment(first_after.index - 1)), 320, 192)
    frames = read_frames(ctx.store.path(key), 320, 192).copy()
    frames[0] = ((before[-1].astype(np.int16) + frames[0]) // 2).astype(np.uint8)
    write_segment(ctx.store.path(key), frames, FPS)
    job = ctx.machine.release(job.job_id, attempt=job.attempt, reason="test: smeared")
    job = run_job(ctx, job.job_id, worker="t")  # encode, mux, qc
    assert job.stage is Stage.FAILED and job.stopped_stage is Stage.QC
    assert f"cuts.cut_{first_after.index}_clean" in job.last_error["message"]
    assert "blend of the two shots" in job.last_error["message"]
    status = run_cli_here("status", job.job_id, env=home_env(tmp_path / "home")).stdout
    assert "the cut is smeared" in status


def test_validate_lists_the_shots(tmp_path: Path):
    manifest = write_manifest(tmp_path / "m.yaml", MANIFEST)
    done = run_cli_here("validate", str(manifest), env=home_env(tmp_path / "home"))
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if "shots.v" in line]
    assert "3" in rows[0]  # three shots
    assert any("2.5 s" in r and "5 s" in r and "cut" in r for r in rows)
    assert any("dissolve 1 s" in r and "8 s" in r for r in rows)
    done = run_cli_here("validate", "--json", str(manifest), env=home_env(tmp_path / "home"))
    [listed] = json.loads(done.stdout)
    assert [s["join"] for s in listed["shots"]] == ["continue", "cut", "dissolve 1 s"]
    assert [(s["start"], s["end"]) for s in listed["shots"]] == [(0, 2.5), (2.5, 5), (5, 8)]
