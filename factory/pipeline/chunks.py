"""Chunks: runs of consecutive segments (about ``CHUNK_SECONDS`` of video) that are encoded,
and measured by the quality gate, as soon as their segments are stored. What a chunk is and
where its GOPs start is pure planning, in factory/plan/chunks.py."""

from __future__ import annotations

import math

from factory.job import Job
from factory.pipeline.context import CHUNK_SECONDS
from factory.pipeline.files import Segments
from factory.plan.chunks import Chunk
from factory.plan.video import video_plan
from factory.spec import VideoSpec


def plan_chunks(video: VideoSpec) -> list[Chunk]:
    """About ``CHUNK_SECONDS`` of segments per chunk, shrinking towards the end of the video:
    the last chunk holds one segment, the one before it two, then four, ... up to the full
    size (a short remainder at the start joins the first chunk). A chunk is encoded and
    measured once its last segment exists, so what is left after the last segment is the
    last chunk's work and what the one before it still needs, not a whole 10 s chunk's."""
    plans = video_plan(video)
    step = video.segment_frames - video.segment_overlap
    per_chunk = max(1, math.ceil(CHUNK_SECONDS * video.fps / step))
    sizes: list[int] = []  # from the end
    left = len(plans)
    while left > 0:
        size = min(per_chunk, 2 ** len(sizes), left)
        sizes.append(size)
        left -= size
    if len(sizes) > 2 and sizes[-1] < per_chunk / 2:
        remainder = sizes.pop()
        sizes[-1] += remainder
    chunks, start = [], 0
    for index, size in enumerate(reversed(sizes)):
        chunks.append(Chunk(index, tuple(plans[start : start + size])))
        start += size
    return chunks


def chunk_key(made: Segments, chunk: Chunk, rendition: str) -> str:
    return made.chunk(rendition, chunk.index, [s.index for s in chunk.segments])


def chunk_ready(job: Job, chunk: Chunk) -> bool:
    """Every segment of the chunk is recorded as done (its files are the recorded ones)."""
    done = set(job.progress["segments"])
    return all(s.index in done for s in chunk.segments)
