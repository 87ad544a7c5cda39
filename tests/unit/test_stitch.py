from __future__ import annotations

import numpy as np
import pytest

from factory.media.stitch import channel_stats, stitch
from factory.plan.segments import SegmentPlan, plan_segments

H, W = 24, 32


def flat(frames: int, rgb: tuple[int, int, int], spread: float = 10.0, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = np.array(rgb, np.float32) + rng.normal(0, spread, (frames, H, W, 3))
    return np.clip(base, 0, 255).astype(np.uint8)


def second_segment():
    return plan_segments(60, 24, 6)[1]  # context 6, writes 18, keeps a tail of 6


def test_first_segment_is_written_as_generated():
    plan = plan_segments(60, 24, 6)[0]
    frames = flat(24, (100, 120, 140))
    out = stitch(plan, frames, None)
    assert np.array_equal(out.frames, frames[:18]) and np.array_equal(out.tail, frames[18:])


def test_alignment_removes_a_colour_jump_at_the_seam():
    plan = second_segment()
    tail = flat(6, (100, 120, 140), seed=1)
    shifted = flat(24, (130, 100, 170), seed=2)  # the model drifted by (+30, -20, +30)
    aligned = stitch(plan, shifted, tail, strength=1.0).frames
    raw = stitch(plan, shifted, tail, strength=0.0).frames
    tail_mean = channel_stats(tail)[0]
    # The first frame after the overlap: aligned close to the tail, raw keeps the jump.
    assert np.abs(channel_stats(aligned[6:7])[0] - tail_mean).max() < 3
    assert np.abs(channel_stats(raw[6:7])[0] - tail_mean).max() > 25
    # The correction fades out: by the last written frame the segment has its own colours.
    assert np.abs(channel_stats(aligned[-1:])[0] - channel_stats(shifted[17:18])[0]).max() < 3


def test_half_strength_goes_half_way():
    plan = second_segment()
    tail = flat(6, (100, 100, 100), spread=0, seed=1)
    new = flat(24, (140, 100, 100), spread=0, seed=2)
    frame = stitch(plan, new, tail, strength=0.5).frames[6]
    assert abs(float(frame[..., 0].mean()) - 120) <= 2


def test_crossfade_weights_over_the_overlap():
    plan = second_segment()
    tail = np.full((6, H, W, 3), 0, np.uint8)
    new = np.full((24, H, W, 3), 140, np.uint8)
    out = stitch(plan, new, tail, strength=0.0).frames
    expected = [round(140 * (j + 1) / 7) for j in range(6)]
    assert [int(out[j, 0, 0, 0]) for j in range(6)] == expected
    assert int(out[6, 0, 0, 0]) == 140


def test_shapes_and_bad_input():
    plan = second_segment()
    out = stitch(plan, flat(24, (1, 2, 3)), flat(6, (1, 2, 3)))
    assert out.frames.shape == (18, H, W, 3) and out.tail.shape == (6, H, W, 3)
    with pytest.raises(ValueError, match="expected 24 frames"):
        stitch(plan, flat(20, (1, 2, 3)), None)
    with pytest.raises(ValueError, match="strength"):
        stitch(plan, flat(24, (1, 2, 3)), None, strength=1.5)


def test_toward_anchor_moves_the_statistics_by_the_factor():
    from factory.media.stitch import anchor_stats, toward_anchor

    anchor = anchor_stats(flat(6, (100, 120, 140), spread=10, seed=1))
    drifted = flat(24, (140, 120, 100), spread=20, seed=2)
    assert toward_anchor(drifted, anchor, 0.0) is drifted
    full = channel_stats(toward_anchor(drifted, anchor, 1.0))
    assert np.abs(full[0] - np.array(anchor["mean"])).max() < 1
    assert np.abs(full[1] - np.array(anchor["std"])).max() < 1
    half = channel_stats(toward_anchor(drifted, anchor, 0.5))[0]
    assert abs(float(half[0]) - 120) < 2 and abs(float(half[2]) - 120) < 2
    with pytest.raises(ValueError, match="drift factor"):
        toward_anchor(drifted, anchor, 2.0)


@pytest.mark.parametrize("seed", range(12))
def test_byte_frames_stitch_bit_for_bit_as_the_float_definition(seed: int) -> None:
    """The table lookup for uint8 frames past the overlap makes exactly what the float32 path
    makes (every plan shape: with and without a tail, any strength, the last segment)."""
    rng = np.random.default_rng(seed)
    frames, context = int(rng.integers(6, 49)), int(rng.integers(1, 9))
    plan = SegmentPlan(index=1, first_frame=0, frames=frames, context=min(context, frames - 1),
                       write_start=0, write_end=int(rng.integers(context, frames + 1)), scene=0,
                       is_last=bool(seed % 3 == 0))  # fmt: skip
    shape = (frames, int(rng.integers(4, 40)), int(rng.integers(4, 40)), 3)
    generated = rng.integers(0, 256, shape) * rng.uniform(0.3, 1) + rng.uniform(0, 90)
    generated = generated.clip(0, 255).astype(np.uint8)
    tail = rng.integers(0, 256, (context + 2, *shape[1:]), dtype=np.uint8)
    for previous in (tail, None):
        for strength in (1.0, 0.37, 0.0):
            as_bytes = stitch(plan, generated, previous, strength)
            as_floats = stitch(plan, generated.astype(np.float32), previous, strength)
            assert np.array_equal(as_bytes.frames, as_floats.frames)
            assert np.array_equal(as_bytes.tail, as_floats.tail)
