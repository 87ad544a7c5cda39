"""Redo planning (factory/redo.py): ranges, segments, the join or the cascade, chunks."""

from __future__ import annotations

import pytest

from factory.errors import BadInput
from factory.manifest import parse_manifest
from factory.pipeline.chunks import plan_chunks
from factory.pipeline.generate import video_plan
from factory.redo import parse_range, plan_redo


def video(model: str = "procedural", duration: float = 120):
    text = (f"batch: b\nvideos:\n  - {{id: v, prompt: x, duration: {duration}, fps: 16, "
            f"resolution: 640x384, model: {model}}}\n")  # fmt: skip
    return parse_manifest(text).videos[0]


def plan(spec, text: str, cascade: bool = False):
    start, end = parse_range(text, spec.duration)
    chunks = [(c.index, tuple(s.index for s in c.segments)) for c in plan_chunks(spec)]
    return plan_redo(spec, video_plan(spec), chunks, {i: 2.0 for i in range(400)},
                     start=start, end=end, cascade=cascade, version=2)  # fmt: skip


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1:10-1:20", (70, 80)), ("70-80", (70, 80)), ("0:01:10.5-0:01:20", (70.5, 80)),
     ("0-120", (0, 120))],
)  # fmt: skip
def test_ranges_in_clock_or_seconds(text: str, expected: tuple[float, float]) -> None:
    assert parse_range(text, 120) == expected


@pytest.mark.parametrize(
    ("text", "says"),
    [("80-70", "ends before it starts"), ("70-70", "ends before it starts"),
     ("110-130", "outside the video"), ("130-140", "outside the video"),
     ("1:10", "is not START-END"), ("a-b", "is not a time")],
)  # fmt: skip
def test_bad_ranges_name_the_field(text: str, says: str) -> None:
    with pytest.raises(BadInput) as caught:
        parse_range(text, 120)
    assert caught.value.field == "--range" and says in str(caught.value)


def test_a_range_makes_its_segments_again_and_joins_the_next() -> None:
    spec = video()
    made = plan(spec, "70-80")
    plans = video_plan(spec)
    covered = [p.index for p in plans if p.write_start < 1280 and p.write_end > 1120]
    assert list(made.segments) == covered and made.join == covered[-1] + 1
    assert made.changed_start == plans[covered[0]].write_start
    assert made.changed_end == plans[made.join].write_start + plans[made.join].context
    members = {c.index: {s.index for s in c.segments} for c in plan_chunks(spec)}
    touched = {i for i, m in members.items() if m & {*made.segments, made.join}}
    assert set(made.chunks) == touched and made.gpu_seconds == 2.0 * len(made.segments)


def test_the_end_of_a_video_has_nothing_to_join() -> None:
    made = plan(video(), "115-120")
    assert made.join is None and made.segments[-1] == len(video_plan(video())) - 1


def test_latent_families_need_a_cascade_and_say_why() -> None:
    spec = video("{family: helios, path: /models/helios}")
    with pytest.raises(BadInput) as caught:
        plan(spec, "30-40")
    assert caught.value.field == "--cascade" and "latents" in str(caught.value)
    made = plan(spec, "30-40", cascade=True)
    assert made.join is None and made.segments[-1] == len(video_plan(spec)) - 1
