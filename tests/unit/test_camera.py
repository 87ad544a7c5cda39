"""Camera-move templates, the pure parts: which template frame each generated frame of a
segment follows (stretched over its scene, or looped, the same for a resumed segment), and
the global motion measured from a template's frames."""

from __future__ import annotations

import numpy as np

from factory.manifest import parse_manifest
from factory.media.control import motion_track
from factory.plan.video import template_frames, video_plan

HEAD = "batch: c\nvideos:\n  - id: v\n    duration: 8\n    fps: 10\n    scenes:\n"


def video(fit: str):
    return parse_manifest(
        HEAD + "      - {start: 0, prompt: a}\n"
        f"      - {{start: 4, prompt: b, camera: {{asset: moves/dolly.mkv, fit: {fit}}}}}\n"
    ).videos[0]


def test_a_template_is_stretched_over_its_scene_or_looped():
    stretched, looped = video("stretch"), video("loop")
    plans = video_plan(stretched)
    first = next(p for p in plans if p.scene == 1)
    assert template_frames(stretched, plans[0], 20) is None  # scene 0 has no camera move
    # The scene is 40 frames at 10 fps; a 20-frame template is stretched 2x or looped.
    mapped = {}
    for plan in (p for p in plans if p.scene == 1):
        for offset, index in enumerate(template_frames(stretched, plan, 20)):
            mapped.setdefault(plan.first_frame + offset, index)
    # stretched smoothly: scene frame i of 40 is at template position i x 19 / 39
    assert [round(mapped[f], 3) for f in range(40, 80, 8)] == [
        round(i * 19 / 39, 3) for i in range(0, 40, 8)
    ]
    assert mapped[79] == 19.0 and max(mapped.values()) == 19.0
    loop = template_frames(looped, first, 20)
    offset = 40 - first.first_frame  # the scene starts inside this segment's frames
    assert loop[offset : offset + 3] == [0, 1, 2]
    assert template_frames(stretched, first, 20) == template_frames(stretched, first, 20)


def test_the_motion_track_follows_a_moving_texture():
    rng = np.random.default_rng(3)
    texture = rng.integers(0, 255, (64, 200, 3)).astype(np.uint8)
    texture = np.repeat(np.repeat(texture, 2, axis=0), 2, axis=1)  # softer grain
    frames = np.stack([texture[:96, 100 - 3 * i : 260 - 3 * i] for i in range(20)])
    track = motion_track(frames)
    assert track.shape == (20, 2)
    assert np.allclose(track[:, 0], [3 * i for i in range(20)]) and not track[:, 1].any()
