"""Parsing a redo's picture and camera-move swaps, applying them to the spec, and which
segments a swap makes again (factory/plan/material.py, factory.spec.with_material)."""

from __future__ import annotations

import pytest

from factory.errors import BadInput
from factory.manifest import parse_manifest
from factory.plan.material import (
    MaterialChange,
    parse_material_change,
    resolved,
    swapped_segments,
)
from factory.plan.video import video_plan
from factory.spec import with_material

VIDEO = parse_manifest(
    "batch: b\nvideos:\n  - id: v\n    duration: 8\n    fps: 12\n    resolution: 64x64\n"
    "    segment: {frames: 24, overlap: 4}\n    renditions: [mobile]\n    scenes:\n"
    "      - {start: 0, prompt: a, image: {asset: k/a.png, as: reference}}\n"
    "      - {start: 3, prompt: b, join: cut, camera: {asset: k/m.mkv, strength: 0.4}}\n"
    "      - {start: 5.5, prompt: c}\n"
).videos[0]


def test_a_swap_is_parsed_with_its_options():
    assert parse_material_change(" 1 = k/p.png ,as=reference", "image") == MaterialChange(
        1, "image", "k/p.png", (("as", "reference"),)
    )
    assert parse_material_change("2=none", "camera") == MaterialChange(2, "camera", None)
    change = parse_material_change("1=k/n.mkv,fit=loop", "camera")
    assert change.options == (("fit", "loop"),)


@pytest.mark.parametrize(
    ("text", "kind", "said"),
    [
        ("x=k/p.png", "image", "is not SCENE=ASSET"),
        ("1=", "image", "is not SCENE=ASSET"),
        ("1=k/p.png,strength=1", "image", "is not one of as=..."),
        ("1=k/p.mkv,as=reference", "camera", "is not one of strength=..., fit=..."),
        ("1=k/p.png,as=reference,as=first-frame", "image", "gives an option twice"),
        ("1=none,as=reference", "image", "takes no options"),
        ("1=k/p.png,as", "image", "is not one of"),
    ],
)
def test_a_malformed_swap_is_refused_naming_its_option(text: str, kind: str, said: str):
    with pytest.raises(BadInput) as caught:
        parse_material_change(text, kind)
    assert caught.value.field == f"--{kind}" and said in str(caught.value)


def test_options_left_out_keep_the_scenes_own_then_the_defaults():
    image = resolved(parse_material_change("0=k/b.png", "image"), VIDEO, "k/b.png")
    assert image == {"asset": "k/b.png", "as": "reference"}  # scene 0's role
    fresh = resolved(parse_material_change("1=k/b.png", "image"), VIDEO, "k/b.png")
    assert fresh == {"asset": "k/b.png", "as": "first-frame"}  # the manifest's default
    moved = resolved(parse_material_change("1=k/n.mkv,fit=loop", "camera"), VIDEO, "k/n.mkv")
    assert moved == {"asset": "k/n.mkv", "strength": 0.4, "fit": "loop"}
    for text, said in (("1=k/n.mkv,strength=2", "outside 0 to 1"),
                       ("1=k/n.mkv,strength=x", "not a number"),
                       ("1=k/n.mkv,fit=bounce", "is not one of")):  # fmt: skip
        with pytest.raises(BadInput, match=said):
            resolved(parse_material_change(text, "camera"), VIDEO, "k/n.mkv")


def test_with_material_swaps_and_removes_and_refuses_what_is_not_material():
    swapped = with_material(VIDEO, {"0": {"image": None}, "2": {"camera": {
        "asset": "k/n.mkv", "strength": 1.0, "fit": "stretch"}}})  # fmt: skip
    assert swapped.scenes[0].image is None and swapped.scenes[2].camera.asset == "k/n.mkv"
    assert swapped.scenes[1] == VIDEO.scenes[1]
    assert with_material(VIDEO, None) is VIDEO and with_material(VIDEO, {}) is VIDEO
    for bad in ({"3": {"image": None}}, {"0": {"sound": None}},
                {"0": {"image": {"asset": "/etc/passwd", "as": "reference"}}},
                {"0": {"image": {"asset": "k/a.png", "as": "sideways"}}},
                {"0": {"camera": {"asset": "k/a.mkv", "strength": 3, "fit": "loop"}}}):  # fmt: skip
        with pytest.raises((ValueError, KeyError, TypeError)):
            with_material(VIDEO, bad)


def test_a_swap_makes_exactly_the_segments_that_take_the_scenes_material():
    plans = video_plan(VIDEO)
    for scenes in ([0], [1], [2], [1, 2], [0, 1, 2]):
        changes = [MaterialChange(s, "image", "k/x.png") for s in scenes]
        (first, last), (start, end) = swapped_segments(plans, changes)
        assert [p.index for p in plans if p.scene in scenes] == list(range(first, last + 1))
        assert start == plans[first].write_start and end > start
    # Scene 0 ends its shot at the cut: its run-on past the cut is its too.
    run_on = [p.index for p in plans if p.shot == 0 and p.owned_count == 0]
    (first, last), _ = swapped_segments(plans, [MaterialChange(0, "image", None)])
    assert run_on and first <= run_on[0] <= last
    apart = [MaterialChange(0, "image", None), MaterialChange(2, "camera", None)]
    with pytest.raises(BadInput, match="not next to each other"):
        swapped_segments(plans, apart)
