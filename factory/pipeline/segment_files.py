"""A segment's files in the store, under names of the attempt that made them: written once
(store_segment), and read back by a cold worker (the tail it continues from, the latents it
carries, the frames its seam is judged against)."""

from __future__ import annotations

import tempfile

import numpy as np

from factory.infra import stopping
from factory.job import Job
from factory.media.intermediate import read_frames, read_tail, write_segment, write_tail
from factory.pipeline.context import StageContext
from factory.pipeline.files import Segments
from factory.plan.segments import SegmentPlan
from factory.qc.seams import WINDOW
from factory.store import keys


def store_segment(
    ctx: StageContext,
    job: Job,
    plan: SegmentPlan,
    frames: np.ndarray,
    tail: np.ndarray,
    carry: bytes | None = None,
    holder: str | None = None,
) -> None:
    """The segment's files under names of this attempt (and of this shot holder, ``holder``):
    whatever a stale holder of the same segment writes lands beside them, never on them; the
    checkpoint then records whose files are the segment."""
    video = job.video
    batch, name, attempt = video.batch, video.video_id, job.attempt
    work = ctx.work_dir(video)
    with tempfile.TemporaryDirectory(dir=work) as scratch:
        segment_file = work / scratch / "segment.mkv"
        write_segment(segment_file, frames, video.fps)
        if plan.tail:
            tail_file = work / scratch / "tail.npy"
            write_tail(tail_file, tail)
            ctx.store.put_file(
                keys.tail(batch, name, plan.index, attempt, holder), tail_file, move=True
            )
        if carry is not None and not plan.is_last:
            ctx.store.put_bytes(keys.carry(batch, name, plan.index, attempt, holder), carry)
        stopping.check()
        ctx.store.put_file(
            keys.segment(batch, name, plan.index, attempt, holder), segment_file, move=True
        )


def recorded(ctx: StageContext, job: Job, index: int) -> Segments:
    record = ctx.machine.segment(job.job_id, index)
    return Segments(job, {index: record} if record is not None else {})


def stored_written_tail(ctx: StageContext, job: Job, index: int) -> np.ndarray:
    """The last frames a stored segment wrote (a cold worker's view of the seam's left side)."""
    video = job.video
    with ctx.store.local_path(recorded(ctx, job, index).segment(index)) as path:
        return np.ascontiguousarray(read_frames(path, video.width, video.height)[-WINDOW:])


def stored_carry(ctx: StageContext, job: Job, index: int) -> bytes:
    with ctx.store.local_path(recorded(ctx, job, index).carry(index)) as path:
        return path.read_bytes()


def stored_tail(ctx: StageContext, job: Job, index: int) -> np.ndarray:
    with ctx.store.local_path(recorded(ctx, job, index).tail(index)) as path:
        return read_tail(path)
