"""Redo a time range of a delivered video (`factory redo JOB --range 1:10-1:20`): which
segments make it again, where the new part joins the untouched rest, which encode chunks
change, and what it should cost. Pure planning over the job's records; nothing is written.

Segment k writes the output frames [write_start, write_end) (factory/plan/segments.py): its first
`overlap` frames are a cross-fade from segment k-1's tail into its own. A range covers the
segments whose written frames it touches. The first of them continues from the stored tail
(or latents) of the segment before it, exactly as in the original run. After the last one:

- pixel-tail families (the tail is frames): the untouched next segment is kept, and only its
  first `overlap` written frames are cross-faded again, from the new tail into its stored
  frames (the *join*); its seam is judged by the quality gate like any seam;
- families whose next segment is conditioned on the previous one's latents (helios,
  anyflow-far): the next segment cannot take a new past without being made again, so the
  redo must run to the end of the video (`--cascade`), and the plan says so.

Encode chunks are named by the segment files they are made of (factory/pipeline/files.py), so
the chunks that hold a redone or joined segment get new names and are encoded again; every
other chunk keeps its name and is reused as it is (stream copy in the join).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from factory.errors import BadInput
from factory.media.presets import GOP_SECONDS
from factory.media.splice import gop_span
from factory.plan.segments import SegmentPlan
from factory.spec import LATENT_FAMILIES, VideoSpec

_CLOCK = re.compile(r"^(?:(\d+):)?(?:(\d+):)?(\d+(?:\.\d+)?)$")


@dataclass(frozen=True)
class RedoPlan:
    start: float  # seconds, as asked
    end: float
    first_frame: int  # the output frames the range covers: [first_frame, end_frame)
    end_frame: int
    segments: tuple[int, ...]  # made again
    join: int | None  # the untouched segment whose first overlap frames are cross-faded again
    cascade: bool
    why: str  # join or cascade, and why
    chunks: tuple[int, ...]  # hold changed frames (per rendition)
    chunks_total: int
    # Frames encoded again per rendition: the GOPs of those chunks that hold changed frames
    # (the chunks' other GOPs are copied from the version before); of `chunks_frames`.
    encode_frames: int
    chunks_frames: int
    gpu_seconds: float  # estimated from the recorded seconds of the segments made again
    version: int  # the version this redo delivers
    # Output frames that may differ from the version before: [changed_start, changed_end);
    # every other frame is the previous version's, bit for bit (in the lossless segments).
    changed_start: int
    changed_end: int
    # Joins between shots it changes (factory/plan/rejoin.py): scene, frame, from, to;
    # such a redo makes no segment (`segments` is empty) and changes no other frame.
    joins: tuple[dict[str, Any], ...] = ()
    # Pictures and camera moves it swaps (factory/plan/material.py): scene, kind, from, to;
    # its segments are those of the scenes named.
    material: tuple[dict[str, Any], ...] = ()

    def describe(self, fps: int) -> list[str]:
        """The plan in lines for people (`--dry-run` prints them)."""
        segments = self.segments
        if not segments:
            changed = [f"join      scene {j['scene']} (frame {j['frame']}): {j['from']} -> "
                       f"{j['to']}" for j in self.joins]  # fmt: skip
            return [
                *changed,
                f"segments  none made again: {self.why}",
                f"encode    {self.encode_frames} frames again per rendition: chunks "
                f"{', '.join(map(str, self.chunks))} ({len(self.chunks)} of "
                f"{self.chunks_total}), which start the shots whose join changed; every other "
                "chunk is reused as it is",
                f"delivers  version {self.version}, beside the ones before; QC must pass first",
            ]
        swapped = [f"{m['kind']:<9} scene {m['scene']}: {m['from']} -> {m['to']}"
                   for m in self.material]  # fmt: skip
        lines = [
            *swapped,
            f"range     {_clock(self.start)}-{_clock(self.end)}: frames {self.first_frame}-"
            f"{self.end_frame - 1} at {fps} fps",
            f"segments  {segments[0]}-{segments[-1]} made again ({len(segments)}), "
            f"about {self.gpu_seconds:.1f} GPU-seconds from their recorded timings",
            f"after     {self.why}",
            f"encode    {self.encode_frames} frames again per rendition: the GOPs of chunks "
            f"{', '.join(map(str, self.chunks))} ({len(self.chunks)} of {self.chunks_total}, "
            f"{self.chunks_frames} frames) that hold frames {self.changed_start}-"
            f"{self.changed_end - 1}; every other GOP is copied as it is",
            f"delivers  version {self.version}, beside the ones before; QC must pass first",
        ]
        return lines

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_range(text: str, duration: float) -> tuple[float, float]:
    """`1:10-1:20`, `70-80`, `0:01:10.5-0:01:20`: (start, end) in seconds, checked against
    the video's length; exit 2 naming --range otherwise."""
    parts = text.strip().split("-")
    if len(parts) != 2 or not all(parts):
        raise BadInput(f"{text!r} is not START-END (e.g. 1:10-1:20 or 70-80)", field="--range")
    start, end = (_seconds(part, text) for part in parts)
    if end <= start:
        raise BadInput(f"{text!r} ends before it starts (reversed or empty)", field="--range")
    if start >= duration or end > duration + 1e-9:
        raise BadInput(
            f"{text!r} is outside the video, which is {_clock(duration)} ({duration:g} s) long",
            field="--range",
        )
    return start, end


def plan_redo(
    video: VideoSpec,
    plans: list[SegmentPlan],
    chunks: list[tuple[int, tuple[int, ...]]],
    seconds: Mapping[int, float],
    *,
    start: float,
    end: float,
    cascade: bool,
    version: int,
    keyframes: Mapping[int, Sequence[int]] | None = None,
    span: tuple[int, int] | None = None,
) -> RedoPlan:
    """``chunks``: (chunk index, its segment indices: its own, then those of the run-on it
    blends in, factory/plan/chunks.py); ``seconds``: each segment's recorded
    generation time; ``keyframes``: where each chunk's GOPs start, in frames from the chunk's
    start (factory/plan/chunks.py; every GOP_SECONDS without it); ``span``: the first and last
    segment to make again where the caller names them (a scene's segments,
    factory/plan/material.py), else those that deliver the frames from ``start`` to ``end``."""
    first, last, a, b = _range_segments(video, plans, start, end, span)
    # The next shot starts from nothing (a cut or a transition): never joined, never made.
    shot_end = max(p.index for p in plans if p.shot == plans[b].shot) + 1
    after = b + 1 if b + 1 < shot_end else None
    why, join, made = _made_and_joined(video, plans, a, b, after, cascade, shot_end)
    changed = set(made) | ({join} if join is not None else set())
    redo_chunks = tuple(index for index, members in chunks if changed & set(members))
    estimate = sum(seconds.get(i, 0.0) for i in made)
    changed_start = plans[a].write_start
    if join is not None:
        changed_end = plans[join].write_start + plans[join].context
    else:
        changed_end = plans[made[-1]].write_end
    encode_frames, chunks_frames = _encode_cost(video, plans, chunks, redo_chunks, keyframes,
                                                changed_start, changed_end)  # fmt: skip
    return RedoPlan(
        start=start,
        end=end,
        first_frame=first,
        end_frame=last,
        segments=tuple(made),
        join=join,
        cascade=cascade or after is None,
        why=why,
        chunks=redo_chunks,
        chunks_total=len(chunks),
        encode_frames=encode_frames,
        chunks_frames=chunks_frames,
        gpu_seconds=round(estimate, 2),
        version=version,
        changed_start=changed_start,
        changed_end=changed_end,
    )


def plan_rejoin(
    video: VideoSpec,
    chunks_before: Sequence[Any],
    chunks_after: Sequence[Any],
    changes: Sequence[Mapping[str, Any]],
    *,
    version: int,
) -> RedoPlan:
    """A redo that changes joins between shots and nothing else (factory/plan/rejoin.py):
    ``chunks_before`` and ``chunks_after`` are the video's chunks (factory/plan/chunks.py)
    with the joins as they are and as they will be, the same chunks by frame, differing
    only in the transitions they blend; ``changes``: scene, frame, from, to, and `frames`,
    the longer of the two transitions' frames."""
    changed = tuple(
        after.index for before, after in zip(chunks_before, chunks_after, strict=True)
        if _blend_of(before) != _blend_of(after)
    )  # fmt: skip
    start = min(c["frame"] for c in changes)
    end = max(c["frame"] + max(c["frames"], 1) for c in changes)
    frames = sum(chunks_after[i].frames for i in changed)
    return RedoPlan(
        start=start / video.fps,
        end=end / video.fps,
        first_frame=start,
        end_frame=end,
        segments=(),
        join=None,
        cascade=False,
        why="the shot before already ran on past every changed join (its run-on), so only "
        "the chunks that start the shots are encoded and checked again",
        chunks=changed,
        chunks_total=len(chunks_after),
        encode_frames=frames,
        chunks_frames=frames,
        gpu_seconds=0.0,
        version=version,
        changed_start=start,
        changed_end=end,
        joins=tuple({k: v for k, v in c.items() if k != "frames"} for c in changes),
    )


def _blend_of(chunk: Any) -> tuple[str, int] | None:
    return (chunk.blend.transition, chunk.blend.frames) if chunk.blend else None


def _made_and_joined(
    video: VideoSpec,
    plans: list[SegmentPlan],
    a: int,
    b: int,
    after: int | None,
    cascade: bool,
    shot_end: int,
) -> tuple[str, int | None, list[int]]:
    """Why, the segment joined into (None: none), and the segments made again (never past
    the end of the shot the range ends in: `shot_end`, its last segment's index + 1)."""
    latent = video.model.family in LATENT_FAMILIES
    end = "the end" if shot_end == len(plans) else f"the end of its shot (segment {shot_end - 1})"
    if after is None and shot_end < len(plans):
        why = (f"the range reaches the end of its shot: segment {shot_end} starts the next "
               "shot from nothing, so nothing after it is joined")  # fmt: skip
        join, made = None, list(range(a, b + 1))
    elif after is None:
        why = "the range reaches the last segment: nothing after it to join"
        join, made = None, list(range(a, b + 1))
    elif cascade:
        why = f"--cascade: every segment from {a} to {end} is made again"
        join, made = None, list(range(a, shot_end))
    elif latent:
        raise BadInput(
            f"{video.model.family} continues each segment from the previous one's latents, so "
            f"segment {after} cannot take a new past without being made again: give --cascade "
            f"to make segments {a}-{shot_end - 1} again ({shot_end - a} segments, to {end})",
            field="--cascade",
        )
    else:
        why = (
            f"segment {after} is kept: its first {plans[after].context} frames are cross-faded "
            "again from the new tail into its stored frames, and that seam is judged"
        )
        join, made = after, list(range(a, b + 1))
    return why, join, made


def _range_segments(
    video: VideoSpec, plans: list[SegmentPlan], start: float, end: float,
    span: tuple[int, int] | None = None,
) -> tuple[int, int, int, int]:  # fmt: skip
    """The range's frames (first, end) and the first and last segments that write them."""
    first = int(start * video.fps + 1e-9)
    last = min(video.frames_total, -int(-end * video.fps // 1))  # ceil
    if span is not None:
        return first, last, *span
    if last <= first:
        raise BadInput(
            f"{_clock(start)}-{_clock(end)} holds no whole frame at {video.fps} fps",
            field="--range",
        )
    # By the frames each segment delivers: a shot's run-on past a cut or into a transition
    # belongs to that shot, and a range inside the next shot never makes it again.
    touched = [p.index for p in plans
               if p.write_start < last and p.write_start + p.owned_count > first]  # fmt: skip
    if not touched:
        raise BadInput(f"{_clock(start)}-{_clock(end)} is inside no segment", field="--range")
    return first, last, touched[0], touched[-1]


def _encode_cost(
    video: VideoSpec,
    plans: list[SegmentPlan],
    chunks: list[tuple[int, tuple[int, ...]]],
    redo_chunks: tuple[int, ...],
    keyframes: Mapping[int, Sequence[int]] | None,
    changed_start: int,
    changed_end: int,
) -> tuple[int, int]:
    """Frames encoded again (the GOPs that hold changed frames) and the frames of the chunks
    they are spliced into, over every chunk the redo touches."""
    encode_frames = chunks_frames = 0
    for index, members in chunks:
        if index not in redo_chunks:
            continue
        own = [m for m in members if plans[m].shot == plans[members[0]].shot]
        chunk_start = plans[own[0]].write_start
        size = sum(plans[m].owned_count for m in own)
        starts = (keyframes or {}).get(index) or range(0, size, GOP_SECONDS * video.fps)
        lo, hi = max(changed_start - chunk_start, 0), min(changed_end - chunk_start, size)
        gop_start, gop_end = gop_span(list(starts), size, lo, hi)
        encode_frames += gop_end - gop_start
        chunks_frames += size
    return encode_frames, chunks_frames


def _seconds(part: str, whole: str) -> float:
    match = _CLOCK.match(part.strip())
    if match is None:
        raise BadInput(
            f"{part!r} in {whole!r} is not a time: seconds (70, 70.5) or M:SS or H:MM:SS",
            field="--range",
        )
    a, b, c = match.groups()
    numbers = [float(x) for x in (a, b, c) if x is not None]
    total = 0.0
    for number in numbers:
        total = total * 60 + number
    return total


def _clock(seconds: float) -> str:
    minutes, rest = divmod(seconds, 60)
    text = f"{int(minutes)}:{rest:05.2f}" if rest % 1 else f"{int(minutes)}:{int(rest):02d}"
    return text


# --- what a redo gives its segments (progress.seeds, progress.prompts) -------------------
# Ranges `[[start, end, value], …]` (half-open, sorted, not overlapping): a redo sets one
# range, cutting what it covers out of the ranges before it, so the list grows with the
# redos still in effect, not with the segments they made (a cascade over 3,000 segments is
# one entry). Maps `{"index": value}` written before ranges read the same.


def given(entries: Any, index: int) -> Any | None:
    """The value a redo gave segment ``index``, or None."""
    if isinstance(entries, Mapping):
        return entries.get(str(index))
    for start, end, value in entries or ():
        if start <= index < end:
            return value
    return None


def give(entries: Any, start: int, end: int, value: Any) -> list[list[Any]]:
    """``entries`` with segments ``start``..``end - 1`` given ``value``."""
    kept: list[list[Any]] = []
    for s, e, v in _ranges(entries):
        if e <= start or s >= end:
            kept.append([s, e, v])
            continue
        if s < start:
            kept.append([s, start, v])
        if e > end:
            kept.append([end, e, v])
    kept.append([start, end, value])
    return sorted(kept, key=lambda r: r[0])


def _ranges(entries: Any) -> list[list[Any]]:
    if not isinstance(entries, Mapping):
        return [list(r) for r in entries or ()]
    ranges: list[list[Any]] = []
    for index, value in sorted((int(k), v) for k, v in entries.items()):
        if ranges and ranges[-1][1] == index and ranges[-1][2] == value:
            ranges[-1][1] = index + 1
        else:
            ranges.append([index, index + 1, value])
    return ranges
