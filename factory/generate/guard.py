"""A generated segment that is not a picture is a failure, not a video: NaN-born output (a
diverged or poisoned model), all black, or one flat colour."""

from __future__ import annotations

import numpy as np

from factory.errors import PermanentError

BLACK_LEVEL = 8.0  # mean 8-bit level below which a segment counts as black
FLAT_SPREAD = 0.5  # standard deviation (8-bit levels) below which it is one flat colour


class BadOutput(PermanentError):
    pass


def check_float_output(video: np.ndarray, what: str) -> None:
    """Before conversion to 8 bits: NaN or infinity means the model diverged."""
    bad = ~np.isfinite(video)
    if bad.any():
        raise BadOutput(f"{what}: the model produced NaN/infinite values "
                        f"({bad.mean():.1%} of the samples)")  # fmt: skip


def check_frames(frames: np.ndarray, what: str) -> None:
    # Every pixel of about eight frames spread over the segment: a segment is one continuous
    # shot, and the whole of a long one in float64 costs hundreds of milliseconds.
    sample = frames[:: max(1, len(frames) // 8)]
    mean, spread = float(sample.mean()), float(sample.std())
    if mean < BLACK_LEVEL and spread < BLACK_LEVEL:
        raise BadOutput(f"{what}: all black (mean level {mean:.1f})")
    if spread < FLAT_SPREAD:
        raise BadOutput(f"{what}: one flat colour (spread {spread:.2f} levels)")
