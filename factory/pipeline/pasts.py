"""Segments as they stood after earlier operations of a job's lineage (a redo's join needs
the frames the segment it joins into had before): read from the store where they are kept,
or made again, in order, from the nearest one known; and the cross-fade that joins them."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from factory.errors import PermanentError
from factory.generate import Generator
from factory.infra import stopping
from factory.job import Job
from factory.media.intermediate import read_frames, read_tail, write_segment, write_tail
from factory.media.stitch import overlap_weights
from factory.pipeline.context import StageContext
from factory.pipeline.lineage import Lineage, lineage
from factory.pipeline.segment_files import recorded
from factory.plan.segments import SegmentPlan
from factory.plan.video import video_plan
from factory.qc.seams import WINDOW
from factory.store import keys


@dataclass
class Past:
    """A segment as it stood after an earlier operation of the lineage: its written frames
    and the tail the segment after it continued from."""

    frames: np.ndarray
    tail: np.ndarray | None


class Pasts:
    """Segments as they stood after earlier operations (``state(k, index)``), made again
    where a join needs them: read from the current segments where those are the same, from
    the stored source of the redo running now, from what an earlier call made again
    (segments/past-*), or made again here, in order, from the nearest one known."""

    def __init__(
        self,
        ctx: StageContext,
        job: Job,
        history: Lineage,
        generator: Generator,
        make: Callable[..., tuple[Any, ...]],
        holder: str | None = None,
    ) -> None:
        """`make`: how the generate stage makes a segment as an operation made it (its
        `_made`), for the segments no file holds any more; `holder`: the shot holder this
        runs for (the past files it writes are its own)."""
        self.ctx, self.job, self.history, self.generator = ctx, job, history, generator
        self.holder = holder
        self._make_segment = make
        self.known: dict[tuple[int, int], Past] = {}
        self.made: list[list[int]] = []  # [operation, segment] made again by this call

    def state(self, k: int, index: int) -> Past:
        pending: list[tuple[int, int]] = []
        while index >= 0:
            found = self._known(k, index)
            if found is not None:
                break
            pending.append((k, index))
            index -= 1
        for at, i in reversed(pending):
            self._make(at, i)
        return self._known(*pending[0]) if pending else found  # type: ignore[return-value]

    def _known(self, k: int, index: int) -> Past | None:
        ctx, job, history = self.ctx, self.job, self.history
        video = job.video
        live = history.operations[-1]
        if live.live and k == history.final - 1 and index == live.join:
            return self._stored(join_source_keys(job, index))
        t = history.touched(k, index)
        if (t, index) in self.known:
            return self.known[(t, index)]
        if history.touched(history.final, index) == t and index in job.progress["segments"]:
            made = recorded(ctx, job, index)
            tail = made.tail(index) if video_plan(video)[index].tail else None
            past = self._stored((made.segment(index), tail))
        else:
            key = keys.past(video.batch, video.video_id, t, index, job.attempt, self.holder)
            if not ctx.store.exists(key):
                return None
            past = self._stored((key, key + ".tail.npy"))
        self.known[(t, index)] = past
        return past

    def _stored(self, names: tuple[str, str | None]) -> Past:
        video = self.job.video
        segment, tail = names
        with self.ctx.store.local_path(segment) as path:
            frames = np.ascontiguousarray(read_frames(path, video.width, video.height))
        if tail is None or not self.ctx.store.exists(tail):
            return Past(frames, None)
        with self.ctx.store.local_path(tail) as path:
            return Past(frames, read_tail(path))

    def _make(self, k: int, index: int) -> None:
        ctx, job, history = self.ctx, self.job, self.history
        if self.generator.carries_latents:
            raise PermanentError(
                f"segment {index} would have to be made as it was before a redo joined into "
                f"it, and {job.video.model.family} cannot (latent families have no joins)"
            )
        video = job.video
        plans = video_plan(video)
        plan = plans[index]
        t = history.touched(k, index)
        op = history.operations[t]
        previous = None if plan.starts_shot else self.state(t, index - 1)
        previous_tail = previous.tail if previous is not None else None
        if history.joined(t, index):
            assert previous_tail is not None
            source = self.state(t - 1, index)
            past = Past(cross_fade(plan, previous_tail, source.frames), source.tail)
        else:
            join = plans[op.join] if op.join is not None and index == op.last else None
            source = self.state(t - 1, join.index) if join is not None else None
            before = None
            if previous is not None:
                before = np.ascontiguousarray(previous.frames[-WINDOW:])
            stitched, *_ = self._make_segment(ctx, job, plan, op, self.generator,
                                 previous_tail if plan.context else None, None, before, join,
                                 source)  # fmt: skip
            past = Past(stitched.frames, stitched.tail if plan.tail else None)
        stopping.check()
        key = keys.past(video.batch, video.video_id, t, index, job.attempt, self.holder)
        with tempfile.TemporaryDirectory(dir=ctx.work_dir(video)) as scratch:
            folder = ctx.work_dir(video) / scratch
            if past.tail is not None:
                write_tail(folder / "tail.npy", past.tail)
                ctx.store.put_file(key + ".tail.npy", folder / "tail.npy", move=True)
            write_segment(folder / "past.mkv", past.frames, video.fps)
            ctx.store.put_file(key, folder / "past.mkv", move=True)
        self.known[(t, index)] = past
        self.made.append([t, index])


def join_source_keys(job: Job, index: int) -> tuple[str, str | None]:
    """The joined segment's files as the version before the running redo stored them (the
    redo's plan names that version's attempt), never a join made since."""
    video = job.video
    source = job.progress["redo"]["join_source"]
    attempt, holder = source["attempt"], source.get("holder")
    tail = keys.tail(video.batch, video.video_id, index, attempt, holder)
    has_tail = video_plan(video)[index].tail
    segment = keys.segment(video.batch, video.video_id, index, attempt, holder)
    return segment, tail if has_tail else None


def job_lineage(ctx: StageContext, job: Job) -> Lineage:
    """The job's lineage. A job with a redo delivered before redos recorded their past is
    made with its own seeds as one run, as it was then (its joins cannot be replayed)."""
    redos: list[dict[str, Any]] = []
    if job.version is not None:
        for version in ctx.machine.versions(job.job_id):
            if version.version <= job.version and version.detail.get("kind") == "redo":
                redos.append(version.detail)
    found = lineage(job.progress, len(video_plan(job.video)), redos)
    if found is None:
        found = lineage(job.progress, len(video_plan(job.video)), [])
        assert found is not None
    return found


def cross_fade(plan: SegmentPlan, tail: np.ndarray, stored: np.ndarray) -> np.ndarray:
    """A kept segment's written frames with its first ``context`` frames cross-faded again,
    from a new previous tail into what it stored (the stitcher's weights); the rest as
    stored, bit for bit."""
    overlap = plan.context
    out = stored.copy()
    weights = overlap_weights(overlap)
    blended = (1 - weights) * tail[-overlap:].astype(np.float32) + weights * stored[
        :overlap
    ].astype(np.float32)
    out[:overlap] = np.clip(np.rint(blended), 0, 255).astype(np.uint8)
    return out
