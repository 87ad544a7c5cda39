"""Chunks: runs of consecutive segments (about ``CHUNK_SECONDS`` of video) that are encoded,
and measured by the quality gate, as soon as their segments are stored; which segments each
chunk holds and where its GOPs start. Pure: no store, no database, no ffmpeg."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from factory.media.presets import GOP_SECONDS
from factory.plan.segments import SegmentPlan
from factory.plan.shots import ShotPlan
from factory.plan.video import video_shots
from factory.spec import TRANSITIONS, VideoSpec

CHUNK_SECONDS = 10.0  # encode this much video per chunk, as soon as its segments exist


@dataclass(frozen=True)
class Blend:
    """The transition a shot's first chunk starts with: its first `frames` frames are the
    outgoing shot's run-on (written by `outgoing`, from `first_frame` on) blended by the
    ffmpeg xfade transition `xfade` with the chunk's own (factory/media/transition.py)."""

    transition: str  # the manifest's name (dissolve, wipe-left, ...)
    frames: int
    first_frame: int  # the incoming shot's first frame
    outgoing: tuple[SegmentPlan, ...]  # the shot before's segments holding its run-on

    @property
    def xfade(self) -> str:
        """ffmpeg's name for the transition."""
        return TRANSITIONS[self.transition]


@dataclass(frozen=True)
class Chunk:
    index: int
    segments: tuple[SegmentPlan, ...]  # the segments whose own frames it holds, in order
    blend: Blend | None = None  # a transition into its shot, blended at its start

    @property
    def frames(self) -> int:
        return sum(s.owned_count for s in self.segments)

    @property
    def made_of(self) -> tuple[SegmentPlan, ...]:
        """Every segment whose file it is made from: its own, and the run-on it blends in."""
        return (self.blend.outgoing if self.blend else ()) + self.segments

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
        count = segment.owned_count
        gops = max(1, math.ceil(count / most))
        starts.extend(offset + count * g // gops for g in range(gops))
        offset += count
    return starts


def plan_chunks(video: VideoSpec) -> list[Chunk]:
    """About ``CHUNK_SECONDS`` of segments per chunk, shrinking towards the end of each shot:
    its last chunk holds one segment, the one before it two, then four, ... up to the full
    size (a short remainder at the shot's start joins its first chunk; the first holds at
    least the frames the shot before ran on past its start, the most a transition blends).
    A chunk is encoded and measured once its last segment exists, so what is left after a
    shot's last segment is its last chunk's work and what the one before it still needs,
    not a whole 10 s chunk's. A chunk never spans two shots: every cut starts a chunk, so it
    is a keyframe in every rendition."""
    step = video.segment_frames - video.segment_overlap
    per_chunk = max(1, math.ceil(CHUNK_SECONDS * video.fps / step))
    chunks: list[Chunk] = []
    shots = video_shots(video)
    for shot in shots:
        owning = tuple(s for s in shot.segments if s.owned_count)
        blend = _blend(video, shots, shot)
        # How many of its first segments a transition into it may span: as far as the shot
        # before ran on, whatever the join is now, so a redo that changes the join
        # (factory/plan/rejoin.py) keeps every chunk as it is but the blend.
        covering, span = 0, shots[shot.index - 1].run_on if shot.index else 0
        if span:
            reach = itertools.accumulate(s.owned_count for s in owning)
            covering = 1 + next(i for i, total in enumerate(reach) if total >= span)
        start = 0
        for size in _chunk_sizes(len(owning), per_chunk, covering):
            chunks.append(Chunk(len(chunks), owning[start : start + size],
                                blend if start == 0 else None))  # fmt: skip
            start += size
    return chunks


def _blend(video: VideoSpec, shots: list[ShotPlan], shot: ShotPlan) -> Blend | None:
    if not shot.join.is_transition:
        return None
    before = shots[shot.index - 1]
    end = shot.start + shot.join.frames
    outgoing = tuple(s for s in before.segments if s.write_end > shot.start and s.write_start < end)
    name = shot.join.kind
    return Blend(name, shot.join.frames, shot.start, outgoing)


def _chunk_sizes(count: int, per_chunk: int, first_at_least: int = 0) -> list[int]:
    """How many segments each chunk of a run of `count` holds, in order; the first at least
    `first_at_least` (a transition is blended within one chunk)."""
    sizes: list[int] = []  # from the end
    left = count
    while left > 0:
        size = min(per_chunk, 2 ** len(sizes), left)
        sizes.append(size)
        left -= size
    if len(sizes) > 2 and sizes[-1] < per_chunk / 2:
        remainder = sizes.pop()
        sizes[-1] += remainder
    sizes.reverse()
    while len(sizes) > 1 and sizes[0] < first_at_least:
        sizes[0:2] = [sizes[0] + sizes[1]]
    return sizes
