"""Chunks: runs of consecutive segments (about ``CHUNK_SECONDS`` of video) that are encoded,
and measured by the quality gate, as soon as their segments are stored; which segments each
chunk holds and where its GOPs start. Pure: no store, no database, no ffmpeg."""

from __future__ import annotations

import math
from dataclasses import dataclass

from factory.media.presets import GOP_SECONDS
from factory.plan.segments import SegmentPlan
from factory.plan.video import video_plan
from factory.spec import VideoSpec

CHUNK_SECONDS = 10.0  # encode this much video per chunk, as soon as its segments exist


@dataclass(frozen=True)
class Chunk:
    index: int
    segments: tuple[SegmentPlan, ...]

    @property
    def frames(self) -> int:
        return sum(s.write_count for s in self.segments)

    @property
    def first_frame(self) -> int:
        """The chunk's first frame in the video."""
        return self.segments[0].write_start


def chunk_keyframes(video: VideoSpec, chunk: Chunk) -> list[int]:
    """Where the chunk's GOPs start (frames from the chunk's start), as its encode makes them.

    `every-2s`: every GOP_SECONDS from the chunk's start (the encoder's own keyframe grid).
    `segments`: at every segment's first frame, its frames split into equal GOPs of at most
    GOP_SECONDS; a redo then replaces whole GOPs, and every frame outside the redone segments
    and the one they join into is the version before's, bit for bit (more keyframes: a few
    percent more bits, docs/benchmarks.md)."""
    most = GOP_SECONDS * video.fps
    if video.keyframes != "segments":
        return list(range(0, chunk.frames, most))
    starts: list[int] = []
    offset = 0
    for segment in chunk.segments:
        count = segment.write_count
        gops = max(1, math.ceil(count / most))
        starts.extend(offset + count * g // gops for g in range(gops))
        offset += count
    return starts


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
