"""Chunks: runs of consecutive segments (about ``CHUNK_SECONDS`` of video, see
factory/pipeline/chunks.py) that are encoded, and measured by the quality gate, as soon as
their segments are stored; and where each chunk's GOPs start. Pure: no store, no database,
no ffmpeg."""

from __future__ import annotations

import math
from dataclasses import dataclass

from factory.media.presets import GOP_SECONDS
from factory.plan.segments import SegmentPlan
from factory.spec import VideoSpec


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
