"""The quality gate inside a job, with defects injected into procedural output: a bad seam is
regenerated with a new seed (bounded, each attempt on the timeline), then the job fails in
`generate`; a frozen segment and black frames stop the job in `qc`, before delivery, with
the reason in `factory status`, and `factory requeue` can continue."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from factory.generate import SegmentSpec, segment_seed
from factory.generate.base import PromptEmbedding
from factory.generate.procedural import ProceduralGenerator
from factory.manifest import parse_manifest
from factory.media.analyze import analyze
from factory.ops.submit import submit
from factory.pipeline.runner import run_job
from factory.spec import ModelChoice
from factory.stages import Stage
from tests.conftest import run_cli_here
from tests.integration.test_pipeline import home_env, in_process

FPS = 12
MANIFEST = (
    "batch: gate\nvideos:\n  - id: v\n    prompt: a harbor at dawn\n"
    f"    duration: {(24 + 5 * 20) / FPS}\n    fps: {FPS}\n    resolution: 160x96\n"
    "    segment: {frames: 24, overlap: 4}\n    renditions: [mobile]\n    seed: 7\n"
)  # 6 segments of 24 frames, 20 new each: 124 frames


class Defective(ProceduralGenerator):
    """Procedural frames with a defect in chosen segments (and only for chosen seeds)."""

    def __init__(self, defect: str, segments: set[int], seeds: set[int] | None = None) -> None:
        self.defect, self.segments, self.seeds = defect, segments, seeds

    def generate(self, seg: SegmentSpec, prompt: PromptEmbedding, context, seed: int):
        frames = super().generate(seg, prompt, context, seed)
        if seg.index not in self.segments or (self.seeds is not None and seed not in self.seeds):
            return frames
        if self.defect == "jump":  # after the overlap, the picture turns red
            shifted = frames[seg.context :].astype(np.int16)
            shifted[..., 0] += 90
            frames[seg.context :] = np.clip(shifted, 0, 255).astype(np.uint8)
        elif self.defect == "freeze":  # the model stops: its last context frame, held
            frames[:] = context[-1]
        elif self.defect == "darken":  # each extension darker (16%): drift, no seam
            frames[:] = (frames * (1 - 0.16 * seg.index)).astype(np.uint8)
        elif self.defect == "black":  # a second of black inside the segment
            frames[seg.context + 2 : seg.context + 2 + FPS] = 0
        return frames


def job_with(home: Path, generator: ProceduralGenerator):
    factory, ctx = in_process(home)
    ctx._generators[ModelChoice("procedural")] = generator
    job = submit(parse_manifest(MANIFEST), factory.jobs, None).jobs[0]
    return factory, ctx, job


def test_a_bad_seam_is_regenerated_with_a_new_seed(tmp_path: Path):
    first_try = {segment_seed(7, 3, 0)}  # only the first attempt at segment 3 is bad
    factory, ctx, job = job_with(tmp_path / "home", Defective("jump", {3}, first_try))
    job = run_job(ctx, job.job_id, worker="t")
    assert job.stage is Stage.DONE, job.last_error
    events = [e for e in factory.jobs.events(job.job_id) if e.event == "seam.regenerated"]
    assert [(e.detail["segment"], e.detail["regeneration"]) for e in events] == [(3, 1)]
    assert "jump" in " ".join(events[0].detail["failures"])
    seam = factory.jobs.segments(job.job_id)[3].seam
    assert seam["regenerations"] == 1 and seam["passed"] is True
    report = json.loads((tmp_path / "home/store/gate/v/qc.json").read_text())
    assert report["passed"] and report["seams"][2]["regenerations"] == 1


def test_a_seam_that_stays_bad_fails_the_job_and_requeue_continues(tmp_path: Path):
    factory, ctx, job = job_with(tmp_path / "home", Defective("jump", {3}))
    job = run_job(ctx, job.job_id, worker="t")
    assert job.stage is Stage.FAILED and job.stopped_stage is Stage.GENERATE
    assert job.last_error["kind"] == "SeamFailed"
    assert "seam before segment 3" in job.last_error["message"]
    assert job.progress["segments"] == [0, 1, 2]  # the good work is kept
    regenerated = [e for e in factory.jobs.events(job.job_id) if e.event == "seam.regenerated"]
    assert [e.detail["regeneration"] for e in regenerated] == [1, 2]
    env = home_env(tmp_path / "home")
    status = run_cli_here("status", job.job_id, env=env).stdout
    assert "SeamFailed" in status and "jump" in status
    assert run_cli_here("requeue", job.job_id, env=env).returncode == 0
    ctx._generators[ModelChoice("procedural")] = ProceduralGenerator()  # the model is fixed
    job = run_job(ctx, job.job_id, worker="t")
    assert job.stage is Stage.DONE


def test_a_frozen_segment_stops_the_job_before_delivery(tmp_path: Path):
    _factory, ctx, job = job_with(tmp_path / "home", Defective("freeze", {2, 3, 4}))
    job = run_job(ctx, job.job_id, worker="t")
    assert job.stage is Stage.FAILED and job.stopped_stage is Stage.QC
    assert "mobile.frozen_frames: frozen from" in job.last_error["message"]
    assert not list(ctx.store.list("gate/v/out"))  # nothing delivered
    report = json.loads(ctx.store.path(job.progress["qc"]["report"]).read_text())
    assert {f["check"] for f in report["failures"]} == {"mobile.frozen_frames"}
    runs = report["renditions"]["mobile"]["content"]["frozen"]
    [[start, end]] = [r for r in runs if r[1] - r[0] >= 2]
    # Segments 2-4 write frames 40..99: 3.33-8.33 s. freezedetect splits that stretch where
    # the encoder refines the still picture (a chunk's first frames), so the failing run is
    # part of it; the runs joined from the chunks are those of one pass over the file.
    assert start >= 3.3 and end <= 8.4 and end - start >= 2.0
    assert any(a <= 3.6 for a, b in runs if b > 3.4) and any(b >= 8.3 for a, b in runs)
    joined = [p for p in ctx.store.list("gate/v/work") if p.endswith("mobile.video.mp4")]
    with ctx.store.local_path(joined[0]) as path:
        whole = analyze({"mobile": path}, FPS, 124 / FPS, reference=None, work=tmp_path / "a")
    one_pass = [[round(a, 3), round(b, 3)] for a, b in whole["mobile"].frozen]
    # the same frames found frozen; a run split only at a chunk boundary is joined again
    assert _covered(runs) == _covered(one_pass)
    assert {a for a, _ in runs} <= {a for a, _ in one_pass}
    status = run_cli_here("status", job.job_id, env=home_env(tmp_path / "home")).stdout
    assert "frozen" in status and "failed (in qc)" in status


def _covered(runs: list[list[float]]) -> list[list[float]]:
    joined: list[list[float]] = []
    for a, b in sorted(runs):
        if joined and a <= joined[-1][1] + 0.01:
            joined[-1][1] = max(joined[-1][1], b)
        else:
            joined.append([a, b])
    return joined


def test_black_frames_stop_the_job_before_delivery(tmp_path: Path):
    _factory, ctx, job = job_with(tmp_path / "home", Defective("black", {2}))
    job = run_job(ctx, job.job_id, worker="t")
    assert job.stage is Stage.FAILED and job.stopped_stage is Stage.QC
    assert "mobile.black_frames: black from" in job.last_error["message"]
    assert ctx.store.exists(job.progress["qc"]["pictures"]["contact"])


def test_colour_drift_over_the_extensions_stops_the_job(tmp_path: Path):
    _factory, ctx, job = job_with(tmp_path / "home", Defective("darken", set(range(6))))
    job = run_job(ctx, job.job_id, worker="t")
    assert job.stage is Stage.FAILED and job.stopped_stage is Stage.QC, job.last_error
    message = job.last_error["message"]
    assert "drift.brightness_scene_0: scene 0, segment 0 to 5: brightness drifts" in message
    assert "drift.contrast_scene_0" in message
    made = _factory.jobs.segments(job.job_id).values()
    assert all(r.seam["passed"] for r in made if r.seam)  # no single seam is bad
