"""Seam and drift scores, and the parsing of ffmpeg's detector output (pure functions)."""

from __future__ import annotations

import numpy as np
import pytest

from factory.media.analyze import black_runs, decode_errors, frozen_runs, input_stats
from factory.qc.seams import scene_drift, score_seam, srgb_to_lab, ssim


def moving(frames: int, shift: float = 0.0, offset: int = 0) -> np.ndarray:
    """A smooth gradient sliding right one pixel per frame, plus a colour shift."""
    x = np.arange(96)[None, :] + np.arange(frames)[:, None] + offset
    row = 60 + 60 * np.sin(x / 9.0)
    picture = np.repeat(row[:, None, :], 64, axis=1)
    rgb = np.stack([picture, picture * 0.8 + 20, 200 - picture], axis=-1) + shift
    return np.clip(rgb, 0, 255).astype(np.uint8)


def test_lab_of_white_black_and_grey():
    assert srgb_to_lab(np.array([255, 255, 255])) == pytest.approx([100, 0, 0], abs=0.05)
    assert srgb_to_lab(np.array([0, 0, 0])) == pytest.approx([0, 0, 0], abs=0.05)
    assert srgb_to_lab(np.array([119, 119, 119]))[0] == pytest.approx(50, abs=0.5)


def test_ssim_is_one_for_identical_frames_and_low_for_unrelated_noise():
    rng = np.random.default_rng(0)
    a, b = (rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(2))
    assert ssim(a, a) == pytest.approx(1.0)
    assert ssim(a, b) < 0.1


def test_a_continuous_seam_passes():
    video = moving(24)
    score = score_seam(video[:8], video[8:], 4, seam=1, frame=8, fps=12)
    assert score.passed and score.jump < 1.5 and score.delta_e < 4


@pytest.mark.parametrize(
    ("shift", "reason"),
    [((0, 0, 40), "colour shift"), ((25, 25, 25), "luminance shift")],
)
def test_a_colour_or_luminance_step_fails_with_its_reason(shift, reason):
    video = moving(24)
    after = np.clip(video[8:].astype(int) + np.array(shift), 0, 255).astype(np.uint8)
    score = score_seam(video[:8], after, 0, seam=1, frame=8, fps=12)
    assert not score.passed and any(reason in f for f in score.failures)


def test_a_cut_is_a_jump_and_a_new_scene_may_change_colour_but_not_cut():
    video, other = moving(24), moving(24, shift=30, offset=40)
    cut = score_seam(video[:8], other[8:], 0, seam=1, frame=8, fps=12)
    assert any(f.startswith("jump") for f in cut.failures)
    tinted = np.clip(video[8:].astype(int) + np.array((0, 0, 40)), 0, 255).astype(np.uint8)
    scene = score_seam(video[:8], tinted, 0, seam=1, frame=8, fps=12, scene_change=True)
    assert scene.passed  # a new scene may change colour
    hard = score_seam(video[:8], 255 - video[8:], 0, seam=1, frame=8, fps=12, scene_change=True)
    assert not hard.passed


def test_drift_skips_the_segment_that_morphs_into_a_new_scene():
    colours = {
        str(i): {"lab": [50.0 + (30 if i >= 2 else 0) + (i == 2) * -15, 0, 0], "spread": 20.0}
        for i in range(5)
    }
    drift = scene_drift([0, 0, 1, 1, 1], colours)
    assert [(d["scene"], d["first_segment"], d["last_segment"]) for d in drift] == [
        (0, 0, 1),
        (1, 3, 4),
    ]
    assert all(d["delta_e"] == pytest.approx(0) for d in drift)


def test_a_freeze_that_runs_to_the_end_lasts_to_the_end():
    log = (
        "[Parsed_freezedetect_3 @ 0x1] lavfi.freezedetect.freeze_start: 1.5\n"
        "[Parsed_freezedetect_3 @ 0x1] lavfi.freezedetect.freeze_duration: 1\n"
        "[Parsed_freezedetect_3 @ 0x1] lavfi.freezedetect.freeze_end: 2.5\n"
        "[Parsed_freezedetect_3 @ 0x1] lavfi.freezedetect.freeze_start: 8.25\n"
    )
    assert frozen_runs(log, 10.0) == [(1.5, 2.5), (8.25, 10.0)]


def test_black_runs_input_stats_and_decode_errors_are_read_from_the_log():
    log = (
        "[blackdetect @ 0x2] black_start:2 black_end:3.04 black_duration:1.04\n"
        "[in#1/mov,mp4 @ 0x5]   Input stream #1:0 (video): 250 packets read (3542911 bytes); "
        "248 frames decoded; 2 decode errors; \n"
        "[hevc @ 0x3] Invalid NAL unit size (4118 > 1302).\n"
        "[null @ 0x4] Application provided invalid, non monotonically increasing dts\n"
    )
    assert black_runs(log) == [(2.0, 3.04)]
    assert input_stats(log) == {1: (248, 2)}
    assert decode_errors(log) == ["[hevc @ 0x3] Invalid NAL unit size (4118 > 1302)."]


@pytest.mark.parametrize("shape", [(12, 64, 64), (20, 36, 64), (5, 7, 9)])
def test_pairs_apart_score_as_each_pair_alone(shape: tuple[int, int, int]) -> None:
    """Window means computed once per frame give each pair's SSIM exactly as the pair alone."""
    from factory.qc.seams import _ssim_stack, _ssims_apart, luma

    frames = np.random.default_rng(sum(shape)).integers(0, 256, (*shape, 3), dtype=np.uint8)
    stack = luma(frames)
    assert np.array_equal(stack, luma(frames.astype(np.float64)))  # the uint8 path's values
    for distance in (1, 9):
        alone = [_ssim_stack(stack[i : i + 1], stack[i + distance : i + distance + 1])[0]
                 for i in range(max(0, len(stack) - distance))]  # fmt: skip
        assert np.array_equal(_ssims_apart(stack, distance), np.asarray(alone))
