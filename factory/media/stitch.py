"""Seam stitching, one segment at a time (never the whole video in memory).

For a segment that continues a previous tail of O frames:

1. alignment: the per-channel mean and spread of the segment's first O frames are matched
   to those of the previous tail (``strength`` 0..1 says how far); the correction is full
   over the overlap and fades out over the rest of the written frames, so the segment
   returns to its own colours without a visible step;
2. cross-fade: over the overlap, output frame j is ``(1 - a) * tail[j] + a * new[j]`` with
   ``a = (j + 1) / (O + 1)``.

The segment then hands back the frames it writes and the tail it keeps for the next one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from factory.plan.segments import SegmentPlan

MAX_SPREAD_RATIO = 2.0


@dataclass(frozen=True)
class Stitched:
    frames: np.ndarray  # the output frames this segment writes, uint8
    tail: np.ndarray  # context for the next segment, uint8 (empty for the last)


def stitch(
    plan: SegmentPlan,
    generated: np.ndarray,
    previous_tail: np.ndarray | None,
    strength: float = 1.0,
) -> Stitched:
    if not 0.0 <= strength <= 1.0:
        raise ValueError(f"strength must be within 0..1, got {strength}")
    if len(generated) != plan.frames:
        raise ValueError(
            f"segment {plan.index}: expected {plan.frames} frames, got {len(generated)}"
        )
    overlap = plan.context if previous_tail is not None else 0
    if generated.dtype != np.uint8:
        out = _stitched_floats(generated.astype(np.float32), previous_tail, overlap, plan, strength)
    else:
        out = _stitched_bytes(generated, previous_tail, overlap, plan, strength)
    end = plan.write_count
    return Stitched(frames=out[:end], tail=out[end : end + plan.tail])


def _stitched_floats(
    frames: np.ndarray, previous_tail: np.ndarray | None, overlap: int, plan: SegmentPlan,
    strength: float,
) -> np.ndarray:  # fmt: skip
    """Every frame in float32: the definition (and the path for a generator's float frames)."""
    if overlap:
        tail = previous_tail[-overlap:].astype(np.float32)
        _align(frames, tail, overlap, plan.write_count, strength)
        weights = overlap_weights(overlap)
        frames[:overlap] = (1 - weights) * tail + weights * frames[:overlap]
    return np.clip(np.rint(frames, out=frames), 0, 255, out=frames).astype(np.uint8)


def _stitched_bytes(
    generated: np.ndarray, previous_tail: np.ndarray | None, overlap: int, plan: SegmentPlan,
    strength: float,
) -> np.ndarray:  # fmt: skip
    """The same frames as `_stitched_floats`, bit for bit, for uint8 frames: the overlap in
    float32 as defined; after it a frame's alignment is one affine map per channel of a byte,
    so its result is looked up in a 256-entry table computed with the same float32 steps
    (a third of the float path's time at 640x360 or less: bench/segment_path.py)."""
    out = generated.copy()
    if not overlap:
        return out
    head = generated[:overlap].astype(np.float32)
    tail = previous_tail[-overlap:].astype(np.float32)
    alignment = _align(head, tail, overlap, plan.write_count, strength, total=len(generated))
    weights = overlap_weights(overlap)
    head = (1 - weights) * tail + weights * head
    out[:overlap] = np.clip(np.rint(head), 0, 255).astype(np.uint8)
    if alignment is None:
        return out
    levels = np.arange(256, dtype=np.float32)[:, None]
    for j in range(overlap, len(generated)):
        table = _aligned(levels, alignment, j)
        if table is not None:
            lut = np.clip(np.rint(table), 0, 255).astype(np.uint8)
            out[j] = np.asarray(Image.fromarray(out[j]).point(lut.T.ravel().tolist()))
    return out


def overlap_weights(overlap: int) -> np.ndarray:
    """The cross-fade's weight of the new frames over ``overlap`` frames, shaped to broadcast
    over [T, H, W, C]: 1/(n+1) ... n/(n+1), never a frame wholly from one side."""
    return (np.arange(1, overlap + 1, dtype=np.float32) / (overlap + 1))[:, None, None, None]


def channel_stats(frames: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and standard deviation (float32), one channel at a time: a reduction
    over the interleaved pixels is eight times slower at 640x360 and sums less accurately."""
    channels = range(frames.shape[-1])
    mean = np.array([frames[..., c].mean(dtype=np.float32) for c in channels], np.float32)
    std = np.array([frames[..., c].std(dtype=np.float32) for c in channels], np.float32)
    return mean, std


@dataclass(frozen=True)
class _Alignment:
    new_mean: np.ndarray
    ratio: np.ndarray
    tail_mean: np.ndarray
    weights: np.ndarray  # per frame, float32: strength x fade


def _align(
    frames: np.ndarray, tail: np.ndarray, overlap: int, written: int, strength: float,
    total: int | None = None,
) -> _Alignment | None:  # fmt: skip
    """Align `frames` in place (those given: all of a segment's, or its overlap only) and give
    the alignment of all `total` frames (None where there is none)."""
    if strength == 0:
        return None
    total = len(frames) if total is None else total
    new_mean, new_std = channel_stats(frames[:overlap])
    tail_mean, tail_std = channel_stats(tail)
    ratio = np.clip(tail_std / np.maximum(new_std, 1e-3), 1 / MAX_SPREAD_RATIO, MAX_SPREAD_RATIO)
    # Full correction over the overlap, fading to none at the last written frame.
    fade = np.ones(total, np.float32)
    span = max(1, written - overlap)
    fade[overlap:] = np.clip(1 - (np.arange(total - overlap) + 1) / span, 0, 1)
    alignment = _Alignment(new_mean, ratio, tail_mean, strength * fade)
    for j in range(len(frames)):
        aligned = _aligned(frames[j], alignment, j)
        if aligned is not None:
            frames[j] = aligned
    return alignment


def _aligned(values: np.ndarray, alignment: _Alignment, j: int) -> np.ndarray | None:
    """Frame j's values aligned (float32), or None where its weight is 0 (left as they are)."""
    w = alignment.weights[j]
    if w == 0:
        return None
    corrected = (values - alignment.new_mean) * alignment.ratio + alignment.tail_mean
    return values + w * (corrected - values)


def anchor_stats(frames: np.ndarray) -> dict[str, list[float]]:
    """The first segment's colour statistics, kept with the job as the drift anchor."""
    mean, std = channel_stats(frames)
    return {"mean": [round(float(v), 4) for v in mean], "std": [round(float(v), 4) for v in std]}


def toward_anchor(frames: np.ndarray, anchor: dict[str, list[float]], factor: float) -> np.ndarray:
    """Move a segment's per-channel statistics ``factor`` (0..1) of the way to the anchor's.

    Counters the slow colour and brightness drift that builds up over many extensions (as
    LTX's ``adain_factor`` does in latent space); 0 leaves the segment alone. Applied before
    stitching, so the seam alignment to the previous tail still has the last word.
    """
    if not 0.0 <= factor <= 1.0:
        raise ValueError(f"drift factor must be within 0..1, got {factor}")
    if factor == 0:
        return frames
    data = frames.astype(np.float32)
    mean, std = channel_stats(data)
    target_mean = np.asarray(anchor["mean"], np.float32)
    ratio = np.clip(np.asarray(anchor["std"], np.float32) / np.maximum(std, 1e-3),
                    1 / MAX_SPREAD_RATIO, MAX_SPREAD_RATIO)  # fmt: skip
    data += factor * ((data - mean) * ratio + target_mean - data)
    return np.clip(np.rint(data), 0, 255).astype(np.uint8)
