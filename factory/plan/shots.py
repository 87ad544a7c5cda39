"""Shots: a video told as runs of scenes joined by a cut or a transition (docs/manifest.md,
"Shots"). Pure arithmetic over frame numbers: no torch, no I/O.

A scene joins the one before it in one of three ways:

- `continue` (the default, and the only way the first scene may join): the same shot goes
  on; the new scene's prompt takes over at a seam, as every scene did before shots;
- `cut`: a new shot, generated from its own start (not conditioned on the tail of the shot
  before), its first frame a keyframe in every rendition;
- a transition (an ffmpeg `xfade` name) over T frames: a new shot, and the T frames from its
  start are a blend of both shots: the outgoing shot runs on past its end (`make_end`), the
  incoming one starts at the boundary as at a cut, and the encoder blends the two.

At a cut or a transition the outgoing shot runs on for R frames (`run_ons`): at least the
transition's T, and at least the video's `run_on` at a cut too (never past the incoming
shot's end), so a redo can change the join up to R frames without making a segment again:
the plan's segments depend on R alone, never on the join's kind (factory/plan/rejoin.py).

So shot k *owns* the delivered frames ``[start, end)`` (``end`` is the next shot's start,
the video's length for the last) and *makes* ``[start, make_end)``, where ``make_end`` is
``end`` plus the next boundary's run-on. Its segments are planned as a video of
their own (factory/plan/segments.py: overlap conditioning, tails and latent carries stay
inside a shot), shifted to the shot's start, numbered on from the shot before's last
segment, so a segment's index is unique in the video as it is today.

Every delivered frame is accounted for once: outside a transition it comes from the one
shot that owns it; inside one it is the blend of the two shots' frames with the same
number (`sources`). A shot must be at least as long as the transition into it, so two
transitions never overlap.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace

from factory.plan.segments import SegmentPlan, plan_segments
from factory.spec import CONTINUE, CUT


@dataclass(frozen=True)
class Join:
    """How a scene joins the one before: `continue`, `cut`, or an xfade transition's name
    with its length in frames."""

    kind: str = CONTINUE  # continue | cut | the transition's name
    frames: int = 0  # a transition's length; 0 for continue and cut

    @property
    def starts_a_shot(self) -> bool:
        return self.kind != CONTINUE

    @property
    def is_transition(self) -> bool:
        return self.kind not in (CONTINUE, CUT)


@dataclass(frozen=True)
class ShotPlan:
    index: int
    start: int  # the first delivered frame it owns
    end: int  # owns [start, end): the next shot's start, or the video's length
    make_end: int  # makes [start, make_end): past `end` by the next transition's frames
    join: Join  # how it joins the shot before (the first shot: continue)
    scenes: tuple[int, ...]  # the manifest's scenes it holds, in order
    segments: tuple[SegmentPlan, ...]  # its chain, in the video's frames and numbering

    @property
    def run_on(self) -> int:
        """Frames it makes past its end for the transition into the next shot."""
        return self.make_end - self.end


@dataclass(frozen=True)
class Source:
    """Where a delivered frame comes from: a shot's segment and the frame's number (the same
    number in every shot: shots share the video's timeline)."""

    shot: int
    segment: int


def plan_shots(
    frames_total: int,
    segment_frames: int,
    overlap: int,
    scene_starts: Sequence[int],
    joins: Sequence[Join],
    first_short: int = 0,
    run_ons: Sequence[int] | None = None,
) -> list[ShotPlan]:
    """The shots of a video whose scenes start at `scene_starts` (output frames, the first
    0) and join the scene before as `joins` says (one per scene; the first must continue);
    `run_ons`: the frames the shot before each scene makes past its end (0 where the scene
    continues it; without it, each transition's length). Raises ValueError naming the scene
    when a join cannot be planned."""
    if run_ons is None:
        run_ons = [join.frames for join in joins]
    _check(frames_total, scene_starts, joins, run_ons)
    bounds = [0, *(i for i, join in enumerate(joins) if join.starts_a_shot), len(joins)]
    shots: list[ShotPlan] = []
    next_segment = 0
    for first_scene, end_scene in itertools.pairwise(bounds):
        start = scene_starts[first_scene]
        end = scene_starts[end_scene] if end_scene < len(joins) else frames_total
        run_on = run_ons[end_scene] if end_scene < len(joins) else 0
        own_starts = [scene_starts[s] - start for s in range(first_scene, end_scene)]
        planned = plan_segments(end + run_on - start, segment_frames, overlap, own_starts,
                                first_short)  # fmt: skip
        segments = tuple(
            replace(
                plan,
                index=next_segment + plan.index,
                first_frame=plan.first_frame + start,
                write_start=plan.write_start + start,
                write_end=plan.write_end + start,
                scene=plan.scene + first_scene,
                shot=len(shots),
                shot_first=next_segment,
                run_on=max(0, plan.write_end + start - max(plan.write_start + start, end)),
            )
            for plan in planned
        )
        next_segment += len(segments)
        scenes = tuple(range(first_scene, end_scene))
        shot = ShotPlan(len(shots), start, end, end + run_on, joins[first_scene], scenes, segments)
        shots.append(shot)
    return shots


def sources(shots: Sequence[ShotPlan], frame: int) -> list[Source]:
    """What delivered frame `frame` is made of: one shot's segment, or, inside a transition,
    the outgoing shot's run-on and the incoming shot's own frame (in that order)."""
    found = []
    for shot in shots:
        following = shots[shot.index + 1] if shot.index + 1 < len(shots) else None
        blended = following.join.frames if following is not None else 0  # (not a cut's run-on)
        if shot.start <= frame < shot.end + blended:
            segment = next(s for s in shot.segments if s.write_start <= frame < s.write_end)
            found.append(Source(shot.index, segment.index))
    return found


def shot_keyframes(shot: ShotPlan, gop_frames: int) -> list[int]:
    """The frames (in the video's numbering) where a rendition's GOPs start within the frames
    the shot owns: at its first frame, so a cut is always a keyframe, then every
    `gop_frames` from there (the encoder's grid restarts at every shot)."""
    return list(range(shot.start, shot.end, gop_frames))


def _check(frames_total: int, scene_starts: Sequence[int], joins: Sequence[Join],
           run_ons: Sequence[int]) -> None:  # fmt: skip
    if not len(scene_starts) == len(joins) == len(run_ons):
        raise ValueError(
            f"{len(scene_starts)} scene starts, {len(joins)} joins, {len(run_ons)} run-ons"
        )
    if not scene_starts or scene_starts[0] != 0 or list(scene_starts) != sorted(scene_starts):
        raise ValueError(f"scene_starts must start at 0 and increase, got {list(scene_starts)}")
    if joins[0].starts_a_shot:
        raise ValueError("scene 0: the first scene has nothing to cut or blend from")
    for scene, join in enumerate(joins):
        if join.is_transition and join.frames < 1:
            raise ValueError(f"scene {scene}: a transition needs at least one frame")
        if not join.is_transition and join.frames:
            raise ValueError(f"scene {scene}: only a transition has a length")
        if run_ons[scene] < join.frames or (run_ons[scene] and not join.starts_a_shot):
            raise ValueError(
                f"scene {scene}: the shot before runs on {run_ons[scene]} frames, not the "
                f"{join.frames} of its {join.kind}"
            )
    shot_starts = [i for i, join in enumerate(joins) if join.starts_a_shot]
    shot_ends = [scene_starts[i] for i in shot_starts[1:]] + [frames_total]
    for scene, shot_end in zip(shot_starts, shot_ends, strict=False):  # none: one shot
        length = shot_end - scene_starts[scene]
        if length < max(1, joins[scene].frames):
            raise ValueError(
                f"scene {scene}: its shot is {length} frames, shorter than the "
                f"{joins[scene].frames}-frame {joins[scene].kind} into it"
            )
