"""Chunk planning: every segment in exactly one chunk, in order; chunks shrink to one segment
at the end so that little is left after the last segment."""

from __future__ import annotations

import pytest

from factory.manifest import parse_manifest
from factory.plan.chunks import plan_chunks
from factory.plan.video import video_plan


def video(duration: float, fps: int = 16, frames: int = 48, overlap: int = 8):
    text = (
        f"batch: b\nvideos:\n  - {{id: v, duration: {duration}, fps: {fps}, resolution: 64x64, "
        f"segment: {{frames: {frames}, overlap: {overlap}}}, prompt: x}}\n"
    )
    return parse_manifest(text).videos[0]


@pytest.mark.parametrize("duration", [1, 3, 5, 10, 30, 60, 120, 600])
def test_chunks_cover_every_segment_once_and_shrink_at_the_end(duration: float):
    spec = video(duration)
    chunks = plan_chunks(spec)
    flat = [s.index for c in chunks for s in c.segments]
    assert flat == [p.index for p in video_plan(spec)]
    assert [c.index for c in chunks] == list(range(len(chunks)))
    sizes = [len(c.segments) for c in chunks]
    assert max(sizes) <= 4 + 1  # 10 s at 16 fps of 40 new frames per segment, + a remainder
    assert sizes[-1] == 1
    if len(sizes) >= 3:
        assert sizes[-2] == 2
    assert sum(c.frames for c in chunks) == spec.frames_total


def test_a_long_video_is_mostly_full_chunks():
    sizes = [len(c.segments) for c in plan_chunks(video(120))]
    assert sizes == [5] + [4] * 10 + [2, 1]
