"""A GPU worker's warm tail is trusted only while it is the recorded segment's: a real Celery
GPU worker holds the tail of segment k-1 in memory, another holder makes segment k-1 again
(a redo's new seed; a second worker whose generator is not bit-exact), and the first worker
then makes segment k. It must continue from the recorded segment's stored tail, or the
recorded seam says passed while the real one jumps (issue 32, defect 4)."""

from __future__ import annotations

import dataclasses
import socket
from pathlib import Path

import numpy as np

from factory.config import Settings
from factory.media.intermediate import read_frames, read_tail
from factory.pipeline.context import StageContext
from factory.pipeline.generate import generate_segment
from factory.plan.video import scene_change, video_plan
from factory.qc.seams import WINDOW, score_seam
from factory.store import keys
from tasks.celery_app import app
from tasks.dispatch import send_segment
from tests.integration.cluster import BROKER, Cluster, manifest


def test_a_segment_remade_elsewhere_is_not_continued_from_the_stale_warm_tail(
    cluster: Cluster, tmp_path: Path
) -> None:
    # 64 frames: 5 segments of 12 new frames
    path = manifest(tmp_path / "m.yaml", "warm", ["a lighthouse on a cliff at dusk"], 1.0,
                    duration=8, segment=(16, 4), renditions=("mobile",))  # fmt: skip
    cluster.start_workers(gpus=1, cpu=False, beat=False)
    (job_id,) = cluster.submit(path)
    factory = cluster.factory()
    machine = factory.jobs
    k = 3
    cluster.wait_segments(job_id, k)  # the worker holds segment 2's tail and makes segment 3
    held = machine.get(job_id)
    # A second holder takes the job (the worker making segment 3 is fenced out and stops,
    # keeping segment 2's tail in memory) and makes segment 2 again with a new seed.
    mine = machine.claim(job_id, seen_attempt=held.attempt, worker="test/second-gpu")
    assert k not in mine.progress["segments"], "the worker finished segment 3 first"
    first_made = machine.segment(job_id, k - 1)
    mine = machine.checkpoint(job_id, attempt=mine.attempt, updates={"seeds": {str(k - 1): 9001}})
    ctx = StageContext.from_settings(Settings.from_env(cluster.env), machine, factory.database)
    before = dataclasses.replace(mine, progress={**mine.progress, "segments": list(range(k - 1))})
    mine, _ = generate_segment(ctx, before)
    remade = machine.segment(job_id, k - 1)
    assert remade is not None and first_made is not None
    assert remade.attempt == mine.attempt != first_made.attempt
    # Back to the first worker, on its own queue, for segment 3.
    mine = machine.release(job_id, attempt=mine.attempt, reason="test: second holder done")
    app.conf.broker_url = BROKER
    send_segment(app, mine, queue=f"gpu.{socket.gethostname()}.0")
    cluster.wait_segments(job_id, k + 1)
    made = machine.segment(job_id, k)
    assert made is not None and made.attempt is not None

    store = cluster.home / "store"
    video = machine.get(job_id).video
    width, height = video.width, video.height

    def segment(index: int, attempt: int) -> np.ndarray:
        return read_frames(store / keys.segment("warm", "v0", index, attempt), width, height)

    old_tail = read_tail(store / keys.tail("warm", "v0", k - 1, first_made.attempt))
    new_tail = read_tail(store / keys.tail("warm", "v0", k - 1, remade.attempt))
    assert not np.array_equal(old_tail, new_tail)  # the remake really is other pictures
    plans = video_plan(video)
    plan = plans[k]
    left = segment(k - 1, remade.attempt)[-WINDOW:]
    right = segment(k, made.attempt)
    real = score_seam(
        left,
        right,
        plan.context,
        seam=k,
        frame=plan.write_start,
        fps=video.fps,
        scene_change=scene_change(machine.get(job_id), plans, k),
        limits=ctx.qc,
    )
    stale = score_seam(
        segment(k - 1, first_made.attempt)[-WINDOW:],
        right,
        plan.context,
        seam=k,
        frame=plan.write_start,
        fps=video.fps,
        limits=ctx.qc,
    )
    recorded = made.seam or {}
    print(
        f"seam {k}: recorded jump {recorded.get('jump')}, passed {recorded.get('passed')}; "
        f"real (recorded segment {k - 1}) jump {real.jump:.2f}, passed {real.passed}; "
        f"against the stale segment {k - 1}: jump {stale.jump:.2f}"
    )
    # The recorded seam is the real one: scored against the segment that is recorded.
    assert real.passed, f"real seam {real.to_dict()} vs recorded {recorded}"
    assert abs(real.jump - recorded["jump"]) < 1e-6
    # And segment 3 continued from the recorded tail: its cross-faded first frames blend
    # the remade tail, not the one the worker kept in memory.
    first = right[0].astype(np.float32)
    to_new = float(np.abs(first - new_tail[0]).mean())
    to_old = float(np.abs(first - old_tail[0]).mean())
    assert to_new < to_old, (to_new, to_old)
