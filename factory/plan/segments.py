"""Segment planning: pure arithmetic over frame counts (no torch, no I/O).

A video of N output frames is generated as segments of L frames. Segment k's generated
frame j lands on output frame ``k * (L - O) + j``: every segment after the first starts on
the last O frames of the one before (it is conditioned on them), so it adds L - O new
frames. The overlap is cross-faded by the stitcher, so segment k *writes*

- the output frames ``[k * (L - O), (k + 1) * (L - O))``: the O blended frames first, then
  its own; its last O generated frames are its *tail*, the context for segment k + 1;
- the last segment writes everything from its start to N, tail included.

Exact behaviour at the edges:

- a video shorter than one segment (N <= L) is one segment; frames past N are discarded;
- the last segment is always generated at full length L (models want fixed lengths) and
  trimmed to N;
- frame counts that do not divide: the last segment writes between 1 and L frames.

The segments' written ranges are consecutive and cover [0, N) exactly once.

Families that continue from latents (helios, anyflow-far) re-decode the last O frames of the
previous segment instead of regenerating them, so their first segment, which has nothing to
re-decode, is O frames shorter (``first_short``): segment 0 generates L - O frames and
segment k >= 1 starts at output frame ``k * (L - O) - O``.
Each segment takes the prompt of the scene in which its first new (not overlapped) frame
falls; a scene boundary at t seconds is output frame round(t * fps).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SegmentPlan:
    index: int
    first_frame: int  # output frame of generated frame 0
    frames: int  # L, generated
    context: int  # generated frames that overlap the previous segment's tail (0 for index 0)
    write_start: int  # output frames this segment writes: [write_start, write_end)
    write_end: int
    scene: int  # index of the scene whose prompt it uses
    is_last: bool  # the last of its shot (a video of one shot: of the video)
    shot: int = 0  # the shot it belongs to (factory/plan/shots.py)
    shot_first: int = 0  # the index of its shot's first segment
    # Written frames past its shot's end: the shot's run-on into a transition, which the
    # next shot's first chunk blends in; the rest, [write_start, write_end - run_on), it owns.
    run_on: int = 0

    @property
    def owned_count(self) -> int:
        """The frames it delivers on its own: all it writes but its run-on."""
        return self.write_count - self.run_on

    @property
    def starts_shot(self) -> bool:
        """The first segment of the video or of a shot: generated from its own start, not
        conditioned on (or seam-judged against) the segment before."""
        return self.index == self.shot_first

    @property
    def write_count(self) -> int:
        return self.write_end - self.write_start

    @property
    def tail(self) -> int:
        """How many of its last generated frames are kept as the next segment's context."""
        return 0 if self.is_last else self.frames - self.write_count


def segment_count(
    frames_total: int, segment_frames: int, overlap: int, first_short: int = 0
) -> int:
    _check(frames_total, segment_frames, overlap)
    first = segment_frames - first_short
    if frames_total <= first:
        return 1
    return 1 + math.ceil((frames_total - first) / (segment_frames - overlap))


def plan_segments(
    frames_total: int,
    segment_frames: int,
    overlap: int,
    scene_starts: Sequence[int] = (0,),
    first_short: int = 0,
) -> list[SegmentPlan]:
    """The segments of a video; ``scene_starts`` are the scenes' first output frames;
    ``first_short`` frames fewer in segment 0 (see the module's note on latent families)."""
    if not 0 <= first_short <= overlap or (first_short and segment_frames - 2 * overlap < 1):
        raise ValueError(
            f"first_short must be within 0..overlap ({overlap}) and leave segment 0 a frame "
            f"to write, got {first_short} with segments of {segment_frames}"
        )
    count = segment_count(frames_total, segment_frames, overlap, first_short)
    if not scene_starts or scene_starts[0] != 0 or list(scene_starts) != sorted(scene_starts):
        raise ValueError(f"scene_starts must start at 0 and increase, got {list(scene_starts)}")
    step = segment_frames - overlap
    plans = []
    for index in range(count):
        short = 0 if index else first_short
        first = index * step - (first_short if index else 0)
        last = index == count - 1
        write_end = frames_total if last else first + step - short
        new_from = min(first + (overlap if index else 0), write_end - 1)
        plans.append(
            SegmentPlan(
                index=index,
                first_frame=first,
                frames=segment_frames - short,
                context=overlap if index else 0,
                write_start=first,
                write_end=write_end,
                scene=_scene_at(new_from, scene_starts),
                is_last=last,
            )
        )
    return plans


def scene_start_frames(scene_starts_seconds: Sequence[float], fps: int) -> list[int]:
    return [round(seconds * fps) for seconds in scene_starts_seconds]


def _scene_at(frame: int, scene_starts: Sequence[int]) -> int:
    scene = 0
    for index, start in enumerate(scene_starts):
        if start <= frame:
            scene = index
    return scene


def _check(frames_total: int, segment_frames: int, overlap: int) -> None:
    if frames_total < 1:
        raise ValueError(f"frames_total must be >= 1, got {frames_total}")
    if not 0 <= overlap <= segment_frames // 2 or segment_frames < 2:
        raise ValueError(
            f"need segment_frames >= 2 and 0 <= overlap <= segment_frames / 2, "
            f"got {segment_frames}, {overlap}"
        )
