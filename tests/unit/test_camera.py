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


def _track_held_whole(frames: np.ndarray) -> np.ndarray:
    """The motion track as it was computed before 2026-12-07: every frame's float luma and
    spectrum held at once (what a 2-minute move could not afford)."""
    track = np.zeros((len(frames), 2), np.float32)
    luma = frames.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
    if len(luma) >= 3:
        luma = luma - np.median(luma, axis=0)
    height, width = luma.shape[1:]
    window = np.outer(np.hanning(height), np.hanning(width)).astype(np.float32)
    fy, fx = np.fft.fftfreq(height)[:, None], np.fft.rfftfreq(width)[None, :]
    lowpass = np.exp(-(fx**2 + fy**2) / (2 * 0.08**2))
    spectra = [np.fft.rfft2((f - f.mean()) * window) for f in luma]
    for i in range(1, len(frames)):
        cross = spectra[i] * np.conj(spectra[i - 1])
        cross = cross / np.maximum(np.abs(cross), 1e-9) * lowpass
        surface = np.fft.irfft2(cross, s=luma.shape[1:])
        y, x = np.unravel_index(int(np.argmax(surface)), surface.shape)
        dy = y - surface.shape[0] if y > surface.shape[0] // 2 else y
        dx = x - surface.shape[1] if x > surface.shape[1] // 2 else x
        track[i] = track[i - 1] + (dx, dy)
    return track


def test_the_track_frame_by_frame_is_the_track_held_whole(monkeypatch):
    """Random moves over a texture with a caption that stands still, with the median taken
    in bands of a few rows (as a long move's is): the same track as before, frame for frame."""
    import factory.media.control as control

    monkeypatch.setattr(control, "STILL_BAND_BYTES", 4 * 30 * 96 * 5)  # 5 rows a band
    rng = np.random.default_rng(11)
    for count in (2, 3, 30):
        texture = rng.integers(0, 255, (140, 260, 3)).astype(np.uint8)
        steps = np.clip(rng.integers(-4, 5, (count, 2)).cumsum(axis=0) + 20, 0, 60)
        frames = np.stack([texture[y : y + 80, x : x + 96] for x, y in steps])
        frames[:, 60:70, 10:50] = 255  # a caption
        assert np.array_equal(motion_track(frames), _track_held_whole(frames)), count
