"""Redo planning (factory/plan/redo.py): ranges, segments, the join or the cascade, chunks."""

from __future__ import annotations

import pytest

from factory.errors import BadInput
from factory.manifest import parse_manifest
from factory.plan.chunks import chunk_keyframes, plan_chunks
from factory.plan.redo import parse_range, plan_redo
from factory.plan.video import video_plan


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


def test_only_the_gops_that_hold_changed_frames_are_encoded_again() -> None:
    """The plan counts the frames of the whole GOPs (every 2 s from each chunk's start) that
    hold a changed frame: at most one GOP less one frame more on each side of the change."""
    spec = video()
    made = plan(spec, "70-80")
    changed = made.changed_end - made.changed_start
    gop = 2 * spec.fps
    assert changed <= made.encode_frames <= changed + 2 * (gop - 1) * len(made.chunks)
    assert made.encode_frames < made.chunks_frames
    whole = sum(c.frames for c in plan_chunks(spec) if c.index in made.chunks)
    assert made.chunks_frames == whole


def test_with_keyframes_at_segments_the_encode_is_the_redone_segments_and_the_join() -> None:
    text = ("batch: b\nvideos:\n  - {id: v, prompt: x, duration: 120, fps: 16, "
            "resolution: 640x384, keyframes: segments}\n")  # fmt: skip
    spec = parse_manifest(text).videos[0]
    start, end = parse_range("70-80", spec.duration)
    planned = plan_chunks(spec)
    chunks = [(c.index, tuple(s.index for s in c.segments)) for c in planned]
    keyframes = {c.index: chunk_keyframes(spec, c) for c in planned}
    made = plan_redo(spec, video_plan(spec), chunks, {}, start=start, end=end, cascade=False,
                     version=2, keyframes=keyframes)  # fmt: skip
    plans = video_plan(spec)
    redone = plans[made.segments[0]].write_start, plans[made.join].write_end
    assert made.changed_end - made.changed_start < made.encode_frames
    assert made.encode_frames <= redone[1] - redone[0]


def test_keyframe_layouts() -> None:
    grid = video()
    for chunk in plan_chunks(grid):
        assert chunk_keyframes(grid, chunk) == list(range(0, chunk.frames, 32))
    text = ("batch: b\nvideos:\n  - {id: v, prompt: x, duration: 120, fps: 16, "
            "resolution: 640x384, segment: {frames: 81, overlap: 16}, "
            "keyframes: segments}\n")  # fmt: skip
    spec = parse_manifest(text).videos[0]
    for chunk in plan_chunks(spec):
        starts = chunk_keyframes(spec, chunk)
        offsets = [s.write_start - chunk.first_frame for s in chunk.segments]
        assert set(offsets) <= set(starts) and starts[0] == 0
        gaps = [b - a for a, b in zip(starts, [*starts[1:], chunk.frames], strict=True)]
        assert max(gaps) <= 32 and min(gaps) >= 16  # 65 new frames a segment: 22 + 22 + 21


def test_the_layout_is_in_the_spec_only_when_not_the_default() -> None:
    spec = video()
    assert spec.keyframes == "every-2s" and "keyframes" not in spec.to_dict()
    with pytest.raises(Exception, match="keyframes"):
        parse_manifest("batch: b\nvideos:\n  - {id: v, prompt: x, duration: 4, fps: 16, "
                       "keyframes: 1s}\n")  # fmt: skip


def test_segments_made_counts_a_redo_join() -> None:
    from factory.plan.video import segments_made

    class J:
        def __init__(self, segments, redo=None):
            self.progress = {"segments": segments, **({"redo": redo} if redo else {})}

    assert segments_made(J([0, 1]), J([0, 1, 2])) == {2}
    redo = {"segments": [3, 4], "join": 5}
    assert segments_made(J([0, 1, 2, 5], redo), J([0, 1, 2, 3, 5], redo)) == {3}
    assert segments_made(J([0, 1, 2, 3, 5], redo), J([0, 1, 2, 3, 4, 5], redo)) == {4, 5}


@pytest.mark.parametrize("prompts", [{}, {"3": "x", "4": "x"}, {"0": "y"}, {"15": "z"}])
def test_a_seam_sees_the_scene_change_that_scene_ids_number(prompts: dict) -> None:
    """The segment path asks scene_change at every seam (two segments); the drift check
    numbers every segment's scene at once (scene_ids): they must agree, redo prompts too."""
    from factory.plan.video import scene_change, scene_ids

    text = ("batch: b\nvideos:\n  - {id: v, duration: 30, fps: 16, resolution: 640x384, "
            "scenes: [{start: 0, prompt: a}, {start: 12, prompt: b}]}\n")  # fmt: skip
    spec = parse_manifest(text).videos[0]

    class Job:
        def __init__(self) -> None:
            self.video, self.progress = spec, {"prompts": prompts}

    ids, plans = scene_ids(Job()), video_plan(spec)
    assert not scene_change(Job(), plans, 0)
    assert [scene_change(Job(), plans, i) for i in range(1, len(plans))] == [
        ids[i] != ids[i - 1] for i in range(1, len(plans))
    ]
    assert sum(scene_change(Job(), plans, i) for i in range(1, len(plans))) >= 1


def test_what_redos_give_their_segments_is_kept_as_ranges_that_do_not_grow() -> None:
    """progress.seeds / progress.prompts: one range per redo still in effect, later redos cut
    what they cover out of earlier ones; maps written before ranges read the same."""
    from factory.plan.redo import give, given

    seeds = give(None, 10, 20, 7)
    seeds = give(seeds, 15, 25, 8)  # overlaps the end of the first
    seeds = give(seeds, 12, 13, 9)  # inside the first
    assert seeds == [[10, 12, 7], [12, 13, 9], [13, 15, 7], [15, 25, 8]]
    assert [given(seeds, i) for i in (9, 10, 12, 13, 15, 24, 25)] == [None, 7, 9, 7, 8, 8, None]
    whole = give(seeds, 0, 3000, 1)  # a cascade over everything: one entry
    assert whole == [[0, 3000, 1]]
    for n in range(200):  # 200 redos of the same range: still one entry
        whole = give(whole, 100, 110, n)
    assert len(whole) == 3 and given(whole, 105) == 199
    legacy = {"4": 5, "5": 5, "7": 6}
    assert [given(legacy, i) for i in (4, 5, 6, 7)] == [5, 5, None, 6]
    assert give(legacy, 6, 7, 1) == [[4, 6, 5], [6, 7, 1], [7, 8, 6]]
