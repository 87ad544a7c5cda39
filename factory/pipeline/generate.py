"""The generate stage: segment after segment, each stitched onto the previous tail and
stored (intermediate + tail) before it is recorded as done. A crash costs at most the
segment in progress; a cold worker resumes from the last stored tail."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from factory.errors import PermanentError, StaleAttempt
from factory.generate import Generator, PromptEmbedding, SegmentSpec, segment_seed
from factory.generate.guard import check_frames
from factory.infra import metrics, stopping
from factory.job import Job, SegmentRecord
from factory.media.intermediate import write_segment, write_tail
from factory.media.stitch import Stitched, anchor_stats, stitch, toward_anchor
from factory.pipeline.context import StageContext
from factory.pipeline.lineage import Operation
from factory.pipeline.pasts import Past, Pasts, cross_fade, job_lineage
from factory.pipeline.segment_files import (
    store_segment,
    stored_carry,
    stored_tail,
    stored_written_tail,
)
from factory.plan.redo import given
from factory.plan.segments import SegmentPlan
from factory.plan.video import (
    next_segment,
    picture_for,
    scene_change_at,
    template_frames,
    video_plan,
)
from factory.qc.seams import WINDOW, colour_record, score_seam
from factory.spec import VideoSpec
from factory.stages import Stage
from factory.store import keys


@dataclass
class WarmTail:
    """What a worker keeps in memory for the job's next segment (saves store reads): the tail
    the next segment continues, and the last frames written before the seam. ``attempt`` is
    the attempt whose files these are: the tail is used only while the segment's record names
    that attempt (another holder may have made the segment again since: a redo, or a requeue
    on a generator that is not bit-exact)."""

    job_id: str
    segment: int
    frames: np.ndarray
    written: np.ndarray | None = None
    carry: bytes | None = None  # latent families: what the next segment continues from
    attempt: int | None = None  # whose files these are (None: never trusted)

    @classmethod
    def after(cls, job: Job, index: int, stitched: Stitched, carry: bytes | None) -> WarmTail:
        """What a worker keeps of segment `index`, which it has just made and recorded."""
        written = np.ascontiguousarray(stitched.frames[-WINDOW:])
        tail = np.ascontiguousarray(stitched.tail)
        return cls(job.job_id, index, tail, written, carry, job.attempt)

    def continues(self, ctx: StageContext, job: Job, index: int) -> bool:
        """Whether segment ``index`` may continue from this tail: it is the job's segment
        ``index - 1`` and that segment's record names the attempt this tail came from. Under
        the same claim that is this holder's own last segment (no other holder can have
        recorded one since without fencing this one out); after a new claim the record is
        read (one row)."""
        if (self.job_id, self.segment) != (job.job_id, index - 1) or self.attempt is None:
            return False
        if self.attempt == job.attempt:
            return True
        record = ctx.machine.segment(job.job_id, index - 1)
        return record is not None and record.attempt == self.attempt


class SeamFailed(PermanentError):
    """A seam stayed bad after every allowed regeneration of the segment after it."""


def generate_segment(
    ctx: StageContext,
    job: Job,
    warm: WarmTail | None = None,
    shot: int | None = None,
    keep: Callable[[], bool] | None = None,
    holder: str | None = None,
) -> tuple[Job, WarmTail | None]:
    """Generate, stitch, check the seam, store and record the job's next segment (of shot
    `shot`, where several holders share a video's shots); the caller holds the job. A bad
    seam regenerates the segment with a new seed (bounded). The segment is made as the
    operation that last made it did (factory/pipeline/lineage.py): its seeds, prompt and
    drift anchor; a segment a redo joined into is its past frames cross-faded again,
    recorded with the redo's last segment. ``keep`` is asked right before anything is
    stored (the holder's lease on the shot is still its own); False: StaleAttempt. ``holder``:
    that lease's id, in the names of the files it stores and fenced with its records."""
    plan = next_segment(job, shot)
    if plan is None:
        return job, warm
    video = job.video
    prompts = ctx.ensure_prompts(video)  # the text encoder alone, before the transformer loads
    generator = ctx.generator(video.model)
    history = job_lineage(ctx, job)
    k = history.touched(history.final, plan.index)
    op = history.operations[k]
    tail, carry, before = _what_it_continues(ctx, job, plan, generator, warm)
    redo = job.progress.get("redo")
    plans = video_plan(video)
    pasts = Pasts(ctx, job, history, generator, _made, holder)
    started = time.monotonic()
    if history.joined(k, plan.index):
        # A redo's join whose last segment a later redo joined into in turn (that later join
        # was recorded, not this one): its past frames cross-faded again here, on their own.
        past = pasts.state(k - 1, plan.index)
        return _join_again(ctx, job, plan, tail, before, past, op, plans, holder), None
    join = plans[op.join] if op.join is not None and plan.index == op.last else None
    source = pasts.state(k - 1, join.index) if join is not None else None

    def regenerated(job_now: Job, seam: Any, regeneration: int) -> None:
        nonlocal job
        job = ctx.machine.checkpoint(
            job_now.job_id,
            attempt=job_now.attempt,
            updates={},
            stage=Stage.GENERATE,
            event="seam.regenerated",
            detail={"segment": plan.index, "regeneration": regeneration,
                    "failures": seam.failures, **seam.to_dict()},
        )  # fmt: skip

    made = _made(ctx, job, plan, op, generator, tail, carry, before, join, source, regenerated)
    stitched, carried, seam, joined, joined_seam, regeneration = made
    stopping.check()  # a holder that lost the job stops before it writes anything
    if keep is not None and not keep():
        raise StaleAttempt(
            job.job_id,
            job.attempt,
            f"the lease on shot {plan.shot} is lost "
            "(another holder has it, or it could not be renewed in time)",
        )
    store_segment(ctx, job, plan, stitched.frames, stitched.tail, carried, holder)
    # The join is recorded only while it is what the current content has (a later redo may
    # have made that segment again since; its seam was judged all the same, as when this redo
    # ran). The join first: a crash between the two records leaves this segment to make
    # again, which cross-fades the join again from the same source.
    if join and joined is not None and source and history.touched(history.final, join.index) == k:
        job = _record_join(ctx, job, join, joined, source.tail, joined_seam, regeneration,
                           holder)  # fmt: skip
    seconds = round(time.monotonic() - started, 3)
    job = _record_made(ctx, job, plan, stitched, seam, regeneration, seconds, generator,
                       prompts, pasts.made, holder)  # fmt: skip
    if redo is not None:
        ctx.machine.note(job.job_id, "redo.segment.done",
                         {"segment": plan.index, "version": redo["version"], "seconds": seconds,
                          **({"join": join.index} if join is not None else {})})  # fmt: skip
    return job, WarmTail.after(job, plan.index, stitched, carried)


def _join_again(
    ctx: StageContext,
    job: Job,
    plan: SegmentPlan,
    tail: np.ndarray | None,
    before: np.ndarray | None,
    past: Past,
    op: Operation,
    plans: list[SegmentPlan],
    holder: str | None,
) -> Job:
    """A joined segment made again from its past frames: cross-faded from `tail`, its seam
    judged against `before`, recorded as the join."""
    join_frames = cross_fade(plan, tail, past.frames)
    seam = score_seam(before, join_frames, plan.context, seam=plan.index,
                      frame=plan.write_start, fps=job.video.fps, limits=ctx.qc,
                      scene_change=scene_change_at(op.prompts, plans, plan.index))  # fmt: skip
    return _record_join(ctx, job, plan, join_frames, past.tail, seam, 0, holder)


def _what_it_continues(
    ctx: StageContext, job: Job, plan: SegmentPlan, generator: Generator, warm: WarmTail | None
) -> tuple[np.ndarray | None, bytes | None, np.ndarray | None]:
    """What the segment continues from the one before: the tail frames it is conditioned on,
    the latents carried (a latent family), and the written frames its seam is judged
    against; from this worker's warm tail when it still holds the segment before, else from
    the store."""
    if plan.starts_shot:  # the video's or a shot's start: nothing before it, no seam
        return None, None, None
    usable = warm is not None and warm.continues(ctx, job, plan.index)
    tail = carry = None
    if plan.context:
        tail = warm.frames if usable and warm else stored_tail(ctx, job, plan.index - 1)
    if generator.carries_latents:
        carry = warm.carry if usable and warm and warm.carry else None
        if carry is None:
            carry = stored_carry(ctx, job, plan.index - 1)
    before = warm.written if usable and warm and warm.written is not None else None
    if before is None:
        before = stored_written_tail(ctx, job, plan.index - 1)
    return tail, carry, before


def _record_made(
    ctx: StageContext,
    job: Job,
    plan: SegmentPlan,
    stitched: Stitched,
    seam: Any,
    regeneration: int,
    seconds: float,
    generator: Generator,
    prompts: Any,
    past_segments_made: Any,
    holder: str | None,
) -> Job:
    """The segment's record (its seam, colour and memory) and its `segment.done` event, in
    one fenced write; the job's drift anchor with segment 0."""
    video = job.video
    used = generator.last_memory
    gpu = (used or {}).get("gpu") or ctx.device
    metrics.segment_done(video.model.family, f"{video.width}x{video.height}", gpu, seconds)
    record = SegmentRecord(
        plan.index,
        job.attempt,
        seconds,
        colour=colour_record(stitched.frames),
        seam={**seam.to_dict(), "regenerations": regeneration} if seam is not None else None,
        memory=used or None,
        holder=holder,
    )
    return ctx.machine.record_segment(
        job.job_id,
        attempt=job.attempt,
        record=record,
        shot=plan.shot,
        updates={
            **({"anchor": anchor_stats(stitched.frames)} if plan.index == 0 else {}),
            "frame": plan.write_end,
        },
        detail={
            "segment": plan.index,
            "seconds": seconds,
            "frames": plan.write_count,
            **({"regenerations": regeneration} if regeneration else {}),
            **({"past_segments_made": past_segments_made} if past_segments_made else {}),
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


def _made(
    ctx: StageContext,
    job: Job,
    plan: SegmentPlan,
    op: Operation,
    generator: Generator,
    tail: np.ndarray | None,
    carry: bytes | None,
    before: np.ndarray | None,
    join: SegmentPlan | None,
    source: Past | None,
    regenerated: Callable[[Job, Any, int], None] | None = None,
) -> tuple[Stitched, bytes | None, Any, np.ndarray | None, Any, int]:
    """The segment as operation ``op`` makes it: generated and stitched, its seam (and the
    seam into the segment it joins, ``join``, from that segment's ``source`` frames) judged,
    regenerated with a new seed while one fails (bounded)."""
    # The pictures and camera moves the operation made its segments with (a later redo may
    # have swapped them: factory/plan/material.py).
    video = job.video_with_material(op.material)
    plans = video_plan(video)
    scene = video.scenes[plan.scene]
    # A redo with a new prompt gives it to the segments it makes again (progress.prompts).
    text = given(op.prompts, plan.index) or scene.prompt
    prompt = ctx.prompt(video.model, text, video.negative_prompt)
    anchor = job.progress.get("anchor") if op.own_anchor else op.anchor
    picture = picture_for(video, plan)
    camera = scene.camera
    template = ctx.template(camera.asset, video) if camera else None
    where = template_frames(video, plan, len(template.frames)) if template else None
    following = [round(p) for p in where] if where else None  # the nearest frame shown
    spec = SegmentSpec(
        plan.index, plan.frames, video.width, video.height, video.fps, plan.first_frame,
        plan.context, plan.shot_first,
        image=ctx.picture(picture.asset, video.width, video.height, video.image_fit)
        if picture else None,
        image_role=picture.role if picture else None,
        control=template.frames[following] if template and following else None,
        control_track=np.stack([np.interp(where, range(len(template.track)), axis)
                                for axis in template.track.T], axis=1)
        if template and where else None,
        control_strength=camera.strength if camera else 1.0,
    )  # fmt: skip
    regeneration = 0
    while True:
        stitched, carried = _make(
            ctx, job, plan, generator, spec, prompt, tail, carry, regeneration,
            seeds=op.seeds, anchor=anchor,
        )  # fmt: skip
        seam = joined = joined_seam = None
        if before is not None:
            seam = score_seam(
                before,
                stitched.frames,
                plan.context if tail is not None else 0,
                seam=plan.index,
                frame=plan.write_start,
                fps=video.fps,
                scene_change=scene_change_at(op.prompts, plans, plan.index),
                limits=ctx.qc,
            )
        if join is not None and source is not None:
            joined, joined_seam = _join_into(ctx, video, op, plans, stitched, join, source)
        bad = next((s for s in (seam, joined_seam) if s is not None and not s.passed), None)
        if bad is None:
            return stitched, carried, seam, joined, joined_seam, regeneration
        if regeneration >= ctx.qc.regenerations:
            raise SeamFailed(
                f"seam before segment {bad.seam} ({bad.seconds:.2f} s) still fails after "
                f"{regeneration} new seed(s) of segment {plan.index}: {'; '.join(bad.failures)}"
            )
        regeneration += 1
        if regenerated is not None:
            regenerated(job, bad, regeneration)


def _join_into(
    ctx: StageContext,
    video: VideoSpec,
    op: Operation,
    plans: list[SegmentPlan],
    stitched: Stitched,
    join: SegmentPlan,
    source: Past,
) -> tuple[np.ndarray, Any]:
    """The segment a redo joins into, cross-faded from this one's tail over its kept
    `source` frames, and the seam between them judged."""
    joined = cross_fade(join, stitched.tail, source.frames)
    return joined, score_seam(
        np.ascontiguousarray(stitched.frames[-WINDOW:]),
        joined,
        join.context,
        seam=join.index,
        frame=join.write_start,
        fps=video.fps,
        scene_change=scene_change_at(op.prompts, plans, join.index),
        limits=ctx.qc,
    )


def _record_join(
    ctx: StageContext,
    job: Job,
    join: SegmentPlan,
    frames: np.ndarray,
    tail: np.ndarray | None,
    seam: Any,
    regeneration: int,
    holder: str | None,
) -> Job:
    """The joined segment under this attempt's (and shot holder's) names: its new frames, and
    its tail as it was (the segment after it continues from that, unchanged)."""
    video = job.video
    batch, name = video.batch, video.video_id
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=ctx.work_dir(video)) as scratch:
        folder = ctx.work_dir(video) / scratch
        write_segment(folder / "join.mkv", frames, video.fps)
        if join.tail and tail is not None:
            write_tail(folder / "tail.npy", tail)
            ctx.store.put_file(keys.tail(batch, name, join.index, job.attempt, holder),
                               folder / "tail.npy", move=True)  # fmt: skip
        stopping.check()
        ctx.store.put_file(keys.segment(batch, name, join.index, job.attempt, holder),
                           folder / "join.mkv", move=True)  # fmt: skip
    made = ctx.machine.segment(job.job_id, join.index)
    record = SegmentRecord(
        join.index,
        job.attempt,
        made.seconds if made else round(time.monotonic() - started, 3),
        colour=colour_record(frames),
        seam={**seam.to_dict(), "regenerations": regeneration, "join": True},
        memory=made.memory if made else None,
        holder=holder,
    )
    return ctx.machine.record_segment(
        job.job_id,
        attempt=job.attempt,
        record=record,
        shot=join.shot,
        updates={},
        detail={"segment": join.index, "join": True, "frames": join.write_count,
                "seconds": round(time.monotonic() - started, 3)},
    )  # fmt: skip


def _make(
    ctx: StageContext,
    job: Job,
    plan: SegmentPlan,
    generator: Generator,
    spec: SegmentSpec,
    prompt: PromptEmbedding,
    tail: np.ndarray | None,
    carry: bytes | None,
    regeneration: int,
    *,
    seeds: Any,
    anchor: dict[str, list[float]] | None,
) -> tuple[Stitched, bytes | None]:
    video = job.video
    own_seed = given(seeds, plan.index)  # a redo's new seed
    seed = segment_seed(video.seed if own_seed is None else own_seed, plan.index, regeneration)
    carried = None
    if generator.carries_latents:
        # A latent family continues the previous segment's latents (and noise, where the
        # family chains it); a regeneration, and a segment a redo gave its own seed, draw
        # this segment's noise from its seed (the chained noise would make it again as it was).
        made, carried = generator.generate_continuing(  # type: ignore[attr-defined]
            spec, prompt, carry, seed, reseed=regeneration > 0 or own_seed is not None
        )
    else:
        made = generator.generate(spec, prompt, tail, seed)
    # C order everywhere: the warm tail and a tail read back from the store must have the same
    # memory layout, or float reductions in the stitcher round differently (1-level drifts).
    frames = np.ascontiguousarray(made)
    check_frames(frames, f"segment {plan.index}")
    if anchor and plan.index > 0 and plan.shot == 0:  # the anchor is the first shot's look
        frames = toward_anchor(frames, anchor, ctx.drift_factor)
    return stitch(plan, frames, tail, ctx.stitch_strength), carried


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


def _backend(generator: object) -> dict[str, Any]:
    """The attention backend and why, for generators that choose one (recorded per segment)."""
    attention = getattr(generator, "attention", None)
    used: dict[str, Any] = (
        {"attention": attention[0], "attention_reason": attention[1]} if attention else {}
    )
    loras = getattr(generator, "active_loras", None)
    if loras:
        used["loras"] = loras
    return used
