"""The generate stage: segment after segment, each stitched onto the previous tail and
stored (intermediate + tail) before it is recorded as done. A crash costs at most the
segment in progress; a cold worker resumes from the last stored tail."""

from __future__ import annotations

import tempfile
import time

import numpy as np

from factory.db.state import Job
from factory.generate import PromptEmbedding, SegmentSpec, segment_seed
from factory.media.intermediate import read_tail, write_segment, write_tail
from factory.pipeline.context import StageContext
from factory.plan import SegmentPlan, plan_segments, scene_start_frames
from factory.spec import VideoSpec
from factory.stages import Stage
from factory.stitch import stitch
from factory.store import keys


def video_plan(video: VideoSpec) -> list[SegmentPlan]:
    starts = scene_start_frames([s.start for s in video.scenes], video.fps)
    return plan_segments(video.frames_total, video.segment_frames, video.segment_overlap, starts)


def run_generate(ctx: StageContext, job: Job) -> Job:
    if job.stage is Stage.QUEUED:
        job = ctx.machine.transition(job.job_id, attempt=job.attempt, to=Stage.GENERATE)
    video = job.video
    plans = video_plan(video)
    generator = ctx.generator(video.model)
    prompts: dict[int, PromptEmbedding] = {}
    done = set(job.progress["segments"])
    tail: np.ndarray | None = None
    for plan in plans:
        if plan.index in done:
            continue
        if plan.context and tail is None:
            tail = _stored_tail(ctx, video, plan.index - 1)
        if plan.scene not in prompts:
            prompts[plan.scene] = generator.encode_prompt(
                video.scenes[plan.scene].prompt, video.negative_prompt
            )
        started = time.monotonic()
        spec = SegmentSpec(
            plan.index,
            plan.frames,
            video.width,
            video.height,
            video.fps,
            plan.first_frame,
            plan.context,
        )
        frames = generator.generate(
            spec,
            prompts[plan.scene],
            tail if plan.context else None,
            segment_seed(video.seed, plan.index),
        )
        stitched = stitch(plan, frames, tail if plan.context else None, ctx.stitch_strength)
        _store_segment(ctx, video, plan, stitched.frames, stitched.tail)
        tail = stitched.tail
        done.add(plan.index)
        seconds = round(time.monotonic() - started, 3)
        job = ctx.machine.checkpoint(
            job.job_id,
            attempt=job.attempt,
            updates={
                "segments": sorted(done),
                "frame": plan.write_end,
                "segment_seconds": {**job.progress["segment_seconds"], str(plan.index): seconds},
            },
            event="segment.done",
            detail={"segment": plan.index, "seconds": seconds, "frames": plan.write_count},
        )
        if ctx.on_segment:
            ctx.on_segment(job, plan.index)
    return ctx.machine.transition(job.job_id, attempt=job.attempt, to=Stage.ENCODE)


def _store_segment(
    ctx: StageContext, video: VideoSpec, plan: SegmentPlan, frames: np.ndarray, tail: np.ndarray
) -> None:
    work = ctx.work_dir(video)
    with tempfile.TemporaryDirectory(dir=work) as scratch:
        segment_file = work / scratch / "segment.mkv"
        write_segment(segment_file, frames, video.fps)
        if plan.tail:
            tail_file = work / scratch / "tail.npy"
            write_tail(tail_file, tail)
            ctx.store.put_file(
                keys.tail(video.batch, video.video_id, plan.index), tail_file, move=True
            )
        # The segment goes last: its presence (with the checkpoint) is what marks it done.
        ctx.store.put_file(
            keys.segment(video.batch, video.video_id, plan.index), segment_file, move=True
        )


def _stored_tail(ctx: StageContext, video: VideoSpec, index: int) -> np.ndarray:
    with ctx.store.local_path(keys.tail(video.batch, video.video_id, index)) as path:
        return read_tail(path)
