"""The shot planner (factory/plan/shots.py, issue 37's planning half): property tests over
any video, segment shape and joins: the shots tile the video, each shot's segments tile
what it makes, every delivered frame comes from one shot or, in a transition, from both
neighbours, no conditioning crosses a shot, and every shot starts on a keyframe."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factory.plan.segments import plan_segments
from factory.plan.shots import Join, plan_shots, shot_keyframes, sources
from factory.spec import CONTINUE, CUT


@st.composite
def videos(draw):
    """A segment shape and a video of scenes, each joined to the one before by a random join,
    every shot at least as long as the transition into it."""
    length = draw(st.integers(2, 48))
    overlap = draw(st.integers(0, length // 2))
    short = draw(st.sampled_from([0, overlap])) if length - 2 * overlap >= 1 else 0
    scenes = draw(st.integers(1, 8))
    joins, starts, at = [Join()], [0], 0
    for _ in range(scenes - 1):
        at += draw(st.integers(1, 120))
        starts.append(at)
        kind = draw(st.sampled_from([CONTINUE, CUT, "dissolve", "fade-black"]))
        frames = draw(st.integers(1, 30)) if kind not in (CONTINUE, CUT) else 0
        joins.append(Join(kind, frames))
    total = at + draw(st.integers(1, 120))
    # a shot shorter than the transition into it is refused: lengthen such videos' shots
    shot_starts = [i for i, j in enumerate(joins) if j.starts_a_shot] + [len(joins)]
    for here, nxt in itertools.pairwise(shot_starts):
        end = starts[nxt] if nxt < len(joins) else total
        need = joins[here].frames - (end - starts[here])
        if need > 0:
            starts = starts[:nxt] + [s + need for s in starts[nxt:]]
            total += need
    return total, length, overlap, short, starts, joins


@settings(max_examples=300, deadline=None)
@given(videos())
def test_the_shots_tile_the_video_and_their_segments_tile_what_they_make(video) -> None:
    total, length, overlap, short, starts, joins = video
    shots = plan_shots(total, length, overlap, starts, joins, short)
    assert shots[0].start == 0 and shots[-1].end == total == shots[-1].make_end
    assert [s.join.starts_a_shot for s in shots] == [False] + [True] * (len(shots) - 1)
    assert len(shots) == 1 + sum(j.starts_a_shot for j in joins)
    for shot, after in itertools.pairwise(shots):
        assert shot.end == after.start and shot.make_end == shot.end + after.join.frames
    numbers = [seg.index for shot in shots for seg in shot.segments]
    assert numbers == list(range(len(numbers)))  # numbered on through the video
    for shot in shots:
        first, *_ = shot.segments
        assert first.first_frame == shot.start and first.context == 0  # nothing carried in
        assert first.write_start == shot.start and shot.segments[-1].write_end == shot.make_end
        for seg, nxt in itertools.pairwise(shot.segments):
            assert seg.write_end == nxt.write_start
        assert {seg.scene for seg in shot.segments} <= set(shot.scenes)


@settings(max_examples=300, deadline=None)
@given(videos())
def test_every_delivered_frame_once_and_a_transition_from_both_neighbours(video) -> None:
    total, length, overlap, short, starts, joins = video
    shots = plan_shots(total, length, overlap, starts, joins, short)
    blended = {
        frame: (shot.index - 1, shot.index)
        for shot in shots
        if shot.join.is_transition
        for frame in range(shot.start, shot.start + shot.join.frames)
    }
    for frame in range(total):
        found = sources(shots, frame)
        owner = next(s.index for s in shots if s.start <= frame < s.end)
        if frame in blended:
            assert tuple(s.shot for s in found) == blended[frame]
        else:
            assert [s.shot for s in found] == [owner]
        for source in found:
            segment = next(
                seg for shot in shots for seg in shot.segments if seg.index == source.segment
            )
            assert segment.write_start <= frame < segment.write_end


@settings(max_examples=200, deadline=None)
@given(videos(), st.integers(1, 60))
def test_every_shot_starts_on_a_keyframe_in_any_gop(video, gop: int) -> None:
    total, length, overlap, short, starts, joins = video
    for shot in plan_shots(total, length, overlap, starts, joins, short):
        keys = shot_keyframes(shot, gop)
        assert keys[0] == shot.start and all(shot.start <= k < shot.end for k in keys)
        assert all(b - a == gop for a, b in itertools.pairwise(keys))


@settings(max_examples=200, deadline=None)
@given(videos())
def test_a_video_of_continuing_scenes_is_one_shot_planned_as_today(video) -> None:
    total, length, overlap, short, starts, _ = video
    joins = [Join()] * len(starts)
    (shot,) = plan_shots(total, length, overlap, starts, joins, short)
    assert list(shot.segments) == plan_segments(total, length, overlap, starts, short)


@pytest.mark.parametrize(
    ("starts", "joins", "total", "problem"),
    [
        ([0], [Join(CUT)], 50, "scene 0: the first scene has nothing to cut or blend from"),
        ([0, 20], [Join(), Join("dissolve", 12)], 30, "scene 1: its shot is 10 frames"),
        ([0, 20, 25], [Join(), Join("wipe-left", 6), Join(CUT)], 60, "scene 1: its shot is 5"),
        ([0, 20], [Join(), Join("dissolve", 0)], 60, "scene 1: a transition needs"),
        ([0, 20], [Join(), Join(CUT, 4)], 60, "scene 1: only a transition has a length"),
        ([0, 20], [Join()], 60, "2 scene starts, 1 joins"),
    ],
)
def test_joins_that_cannot_be_planned_name_their_scene(starts, joins, total, problem) -> None:
    with pytest.raises(ValueError, match=problem):
        plan_shots(total, 16, 4, starts, joins)


def test_a_dissolve_is_made_by_both_shots() -> None:
    """Two shots of 48 frames joined by a 12-frame dissolve: the first makes 60 frames (its
    48 and the 12 it runs on), the second makes its own 48 from frame 48; frames 48-59 are
    the blend of the two."""
    shots = plan_shots(96, 24, 4, [0, 48], [Join(), Join("dissolve", 12)])
    first, second = shots
    assert (first.start, first.end, first.make_end, first.run_on) == (0, 48, 60, 12)
    assert (second.start, second.end, second.make_end) == (48, 96, 96)
    assert [s.shot for s in sources(shots, 47)] == [0]
    assert [s.shot for s in sources(shots, 48)] == [0, 1]
    assert [s.shot for s in sources(shots, 59)] == [0, 1]
    assert [s.shot for s in sources(shots, 60)] == [1]
    assert second.segments[0].index == first.segments[-1].index + 1
