"""Chunks as the encode and QC stages find them: a chunk's key in the store (named by the
segment files it is made of) and whether its segments are recorded. What a chunk is, which
segments each holds and where its GOPs start is pure planning, in factory/plan/chunks.py."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from factory.job import Job
from factory.media.transition import blend_transition, first_frames
from factory.pipeline.context import StageContext
from factory.pipeline.files import Segments
from factory.plan.chunks import Chunk


def chunk_key(made: Segments, chunk: Chunk, rendition: str) -> str:
    blend = (chunk.blend.transition, chunk.blend.frames) if chunk.blend else None
    return made.chunk(rendition, chunk.index, [s.index for s in chunk.made_of], blend)


def chunk_ready(job: Job, chunk: Chunk) -> bool:
    """Every segment the chunk is made from is recorded as done (its files are the recorded
    ones), the run-on it blends in included."""
    done = set(job.progress["segments"])
    return all(s.index in done for s in chunk.made_of)


def chunk_sources(
    ctx: StageContext, made: Segments, chunk: Chunk, stack: ExitStack, scratch: Path
) -> list[tuple[Path, int]]:
    """The lossless files the chunk's frames are, in order, with their frame counts: its
    segment files, where a shot's last ones are cut to the frames the shot owns (their
    run-on left out) and, after a transition, the first ones replaced by the blend of the
    shot before's run-on into them (factory/media/transition.py). The encoder and the
    quality gate read the same list, so the gate measures what was encoded."""
    video = made.job.video
    local = {s.index: stack.enter_context(ctx.store.local_path(made.segment(s.index)))
             for s in chunk.made_of}  # fmt: skip
    own = list(chunk.segments)
    entries: list[tuple[Path, int]] = []
    if chunk.blend is not None:
        blend, covering = chunk.blend, []
        while sum(s.owned_count for s in covering) < blend.frames:
            covering.append(own.pop(0))
        keep = sum(s.owned_count for s in covering)
        target = scratch / f"blend-{chunk.index}.mkv"
        blend_transition(
            [(local[s.index], s.write_count) for s in blend.outgoing],
            blend.first_frame - blend.outgoing[0].write_start,
            [(local[s.index], s.write_count) for s in covering],
            keep, blend.xfade, blend.frames, video.fps, target,
        )  # fmt: skip
        entries.append((target, keep))
    for segment in own:
        path = local[segment.index]
        if segment.run_on:
            path, source = scratch / f"owned-{segment.index}.mkv", path
            first_frames(source, segment.owned_count, path)
        entries.append((path, segment.owned_count))
    return entries
