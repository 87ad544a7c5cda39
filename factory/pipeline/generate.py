"""The generate stage: segment after segment, each stitched onto the previous tail and
stored (intermediate + tail) before it is recorded as done. A crash costs at most the
segment in progress; a cold worker resumes from the last stored tail."""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass

import numpy as np

from factory.db.state import Job
from factory.generate import SegmentSpec, segment_seed
from factory.generate.guard import check_frames
from factory.media.intermediate import read_tail, write_segment, write_tail
from factory.pipeline.context import StageContext
from factory.plan import SegmentPlan, plan_segments, scene_start_frames
from factory.spec import VideoSpec
from factory.stages import Stage
from factory.stitch import anchor_stats, stitch, toward_anchor
from factory.store import keys


def video_plan(video: VideoSpec) -> list[SegmentPlan]:
    starts = scene_start_frames([s.start for s in video.scenes], video.fps)
    return plan_segments(video.frames_total, video.segment_frames, video.segment_overlap, starts)


@dataclass
class WarmTail:
    """The tail a worker keeps in memory for the job's next segment (saves a store read)."""

    job_id: str
    segment: int
    frames: np.ndarray


def next_segment(job: Job) -> SegmentPlan | None:
    done = set(job.progress["segments"])
    return next((p for p in video_plan(job.video) if p.index not in done), None)


def generate_segment(
    ctx: StageContext, job: Job, warm: WarmTail | None = None
) -> tuple[Job, WarmTail | None]:
    """Generate, stitch, store and record the job's next segment; the caller holds the job."""
    plan = next_segment(job)
    if plan is None:
        return job, warm
    video = job.video
    prompts = ctx.ensure_prompts(video)  # the text encoder alone, before the transformer loads
    generator = ctx.generator(video.model)
    tail = None
    if plan.context:
        usable = warm is not None and (warm.job_id, warm.segment) == (job.job_id, plan.index - 1)
        tail = warm.frames if usable else _stored_tail(ctx, video, plan.index - 1)
    scene = video.scenes[plan.scene]
    prompt = ctx.prompt(video.model, scene.prompt, video.negative_prompt)
    started = time.monotonic()
    spec = SegmentSpec(plan.index, plan.frames, video.width, video.height, video.fps,
                       plan.first_frame, plan.context)  # fmt: skip
    # C order everywhere: the warm tail and a tail read back from the store must have the same
    # memory layout, or float reductions in the stitcher round differently (1-level drifts).
    frames = np.ascontiguousarray(
        generator.generate(spec, prompt, tail, segment_seed(video.seed, plan.index))
    )
    check_frames(frames, f"segment {plan.index}")
    anchor = job.progress.get("anchor")
    if anchor and plan.index > 0:
        frames = toward_anchor(frames, anchor, ctx.drift_factor)
    stitched = stitch(plan, frames, tail, ctx.stitch_strength)
    _store_segment(ctx, video, plan, stitched.frames, stitched.tail)
    seconds = round(time.monotonic() - started, 3)
    used = getattr(generator, "last_memory", None)
    job = ctx.machine.checkpoint(
        job.job_id,
        attempt=job.attempt,
        updates={
            **({"anchor": anchor_stats(stitched.frames)} if plan.index == 0 else {}),
            "segments": sorted({*job.progress["segments"], plan.index}),
            "frame": plan.write_end,
            "segment_seconds": {**job.progress["segment_seconds"], str(plan.index): seconds},
            **(
                {"memory": {**job.progress.get("memory", {}), str(plan.index): used}}
                if used
                else {}
            ),
        },
        event="segment.done",
        detail={
            "segment": plan.index,
            "seconds": seconds,
            "frames": plan.write_count,
            **_backend(generator),
            **({"memory": used} if used else {}),
            **(
                {"prompt_cache": {"hits": prompts.hits, "misses": prompts.misses}}
                if prompts
                else {}
            ),
            "family": video.model.family,
            "resolution": f"{video.width}x{video.height}",
            "segment_frames": plan.frames,
        },
    )
    return job, WarmTail(job.job_id, plan.index, np.ascontiguousarray(stitched.tail))


def run_generate(ctx: StageContext, job: Job) -> Job:
    """Every remaining segment in order, then on to `encode` (the embedded path)."""
    if job.stage is Stage.QUEUED:
        job = ctx.machine.transition(job.job_id, attempt=job.attempt, to=Stage.GENERATE)
    warm: WarmTail | None = None
    while (plan := next_segment(job)) is not None:
        job, warm = generate_segment(ctx, job, warm)
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


def _backend(generator: object) -> dict[str, str]:
    """The attention backend and why, for generators that choose one (recorded per segment)."""
    attention = getattr(generator, "attention", None)
    return {"attention": attention[0], "attention_reason": attention[1]} if attention else {}
