from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from factory.plan.segments import plan_segments, scene_start_frames, segment_count


@pytest.mark.parametrize(
    ("frames", "length", "overlap", "expected"),
    [
        (1, 16, 4, 1),
        (16, 16, 4, 1),
        (17, 16, 4, 2),
        (28, 16, 4, 2),
        (29, 16, 4, 3),
        (2880, 48, 8, 72),
        (2880, 16, 0, 180),
    ],
)
def test_segment_count(frames: int, length: int, overlap: int, expected: int):
    assert segment_count(frames, length, overlap) == expected


@pytest.mark.parametrize(("frames", "length", "overlap"), [(0, 16, 4), (10, 4, 3), (10, 4, -1)])
def test_impossible_plans_are_refused(frames: int, length: int, overlap: int):
    with pytest.raises(ValueError):
        segment_count(frames, length, overlap)


@st.composite
def plans(draw):
    length = draw(st.integers(2, 128))
    overlap = draw(st.integers(0, length // 2))
    frames = draw(st.integers(1, 5000))
    starts = sorted(set(draw(st.lists(st.integers(1, max(1, frames - 1)), max_size=6))))
    return frames, length, overlap, [0, *[s for s in starts if s < frames]]


@given(plans())
def test_segments_cover_every_output_frame_exactly_once(case):
    frames, length, overlap, scenes = case
    segments = plan_segments(frames, length, overlap, scenes)
    written = [f for s in segments for f in range(s.write_start, s.write_end)]
    assert written == list(range(frames))
    assert len(segments) == segment_count(frames, length, overlap)


@given(plans())
def test_each_segment_continues_the_tail_of_the_one_before(case):
    frames, length, overlap, scenes = case
    segments = plan_segments(frames, length, overlap, scenes)
    assert segments[0].context == 0 and segments[0].first_frame == 0
    for before, after in itertools.pairwise(segments):
        assert after.context == overlap == before.tail
        # The context frames are exactly the previous segment's last generated frames.
        assert after.first_frame == before.first_frame + length - overlap
        assert after.write_start == before.write_end
    for segment in segments:
        assert segment.frames == length
        assert 1 <= segment.write_count <= length
        assert segment.write_end <= segment.first_frame + length  # never past what was made
    assert segments[-1].is_last and segments[-1].tail == 0
    assert all(not s.is_last for s in segments[:-1])


@given(plans())
def test_scenes_are_assigned_in_order(case):
    frames, length, overlap, scenes = case
    segments = plan_segments(frames, length, overlap, scenes)
    indices = [s.scene for s in segments]
    assert indices == sorted(indices) and min(indices) >= 0 and max(indices) < len(scenes)


def test_short_video_is_one_trimmed_segment():
    (only,) = plan_segments(10, 16, 4)
    assert (only.write_start, only.write_end, only.frames, only.tail) == (0, 10, 16, 0)


def test_partial_last_segment():
    segments = plan_segments(30, 16, 4)
    assert [(s.write_start, s.write_end) for s in segments] == [(0, 12), (12, 24), (24, 30)]
    assert segments[-1].write_count == 6 and segments[-1].first_frame == 24


def test_scene_of_a_segment_is_where_its_new_frames_begin():
    # 24 fps, scenes at 0 s and 1 s (frame 24); L=16, O=4: segment 2 starts at 24 with
    # context 24..27, its first new frame is 28, in scene 1; segment 1's is 16, scene 0.
    segments = plan_segments(48, 16, 4, scene_start_frames([0, 1.0], 24))
    assert [s.scene for s in segments] == [0, 0, 1, 1]


@st.composite
def latent_plans(draw):
    """Latent families: segment 0 is `overlap` frames shorter (it has nothing to re-decode)."""
    overlap = draw(st.integers(0, 16))
    length = draw(st.integers(max(2, 2 * overlap + 1), 160))
    frames = draw(st.integers(1, 5000))
    return frames, length, overlap


@given(latent_plans())
def test_a_shorter_first_segment_keeps_every_frame_once_and_every_overlap(case):
    frames, length, overlap = case
    segments = plan_segments(frames, length, overlap, (0,), overlap)
    written = [f for s in segments for f in range(s.write_start, s.write_end)]
    assert written == list(range(frames))
    assert len(segments) == segment_count(frames, length, overlap, overlap)
    assert segments[0].frames == length - overlap and segments[0].first_frame == 0
    for before, after in itertools.pairwise(segments):
        assert after.frames == length and after.context == overlap == before.tail
        assert after.first_frame == before.first_frame + before.frames - overlap
        assert after.write_start == before.write_end
    assert all(s.write_count >= 1 for s in segments)


def test_a_first_segment_that_would_write_nothing_is_refused():
    with pytest.raises(ValueError, match="leave segment 0 a frame"):
        plan_segments(100, 24, 12, (0,), 12)
