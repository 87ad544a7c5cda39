"""The order a node warms a batch's material in (`factory preload`, ops.views.preload_order):
camera moves, then what else generation reads (scene pictures, LoRAs), then the cues, then
the beds, the ones
more videos use first; each asset once, at its most urgent kind."""

from __future__ import annotations

from factory.manifest import parse_manifest
from factory.ops.views import preload_order

MANIFEST = """batch: b
defaults: {duration: 8, model: {family: procedural}}
videos:
  - id: one
    scenes: [{start: 0, prompt: a, image: {asset: pics/hero.png}}]
    audio: {asset: beds/rare.ogg, cues: [{at: 1, asset: fx/bell.ogg}]}
  - id: two
    prompt: b
    audio: {asset: beds/common.ogg, cues: [{at: 2, asset: fx/whoosh.ogg}]}
  - id: three
    scenes: [{start: 0, prompt: c, image: {asset: fx/bell.ogg, as: reference},
              camera: {asset: moves/dolly.mkv}}]
    audio: {asset: beds/common.ogg}
"""


def test_pictures_then_cues_then_beds_by_use():
    videos = parse_manifest(MANIFEST).videos
    assert preload_order(videos) == [
        ("moves/dolly.mkv", "camera"),  # camera moves first, as the source design has it
        ("pics/hero.png", "picture"),
        ("fx/bell.ogg", "picture"),  # a cue elsewhere, a picture here: the more urgent kind
        ("fx/whoosh.ogg", "cue"),
        ("beds/common.ogg", "bed"),  # two videos use it
        ("beds/rare.ogg", "bed"),
    ]
    assert {r for r, _ in preload_order(videos)} == {a for v in videos for a in v.assets}
