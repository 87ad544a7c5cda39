from __future__ import annotations

import pytest

from factory.plan import segment_count


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


@pytest.mark.parametrize(("frames", "length", "overlap"), [(0, 16, 4), (10, 4, 4), (10, 4, -1)])
def test_segment_count_refuses_impossible_plans(frames: int, length: int, overlap: int):
    with pytest.raises(ValueError):
        segment_count(frames, length, overlap)
