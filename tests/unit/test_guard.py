from __future__ import annotations

import numpy as np
import pytest

from factory.generate.guard import BadOutput, check_float_output, check_frames


def test_a_picture_passes():
    rng = np.random.default_rng(0)
    check_frames(rng.integers(0, 255, (4, 16, 16, 3), dtype=np.uint8), "seg")
    check_float_output(rng.random((4, 16, 16, 3)), "seg")


def test_nan_black_and_flat_output_fail():
    poisoned = np.zeros((2, 8, 8, 3), np.float32)
    poisoned[0, 0, 0, 0] = np.nan
    with pytest.raises(BadOutput, match="NaN"):
        check_float_output(poisoned, "seg 3")
    with pytest.raises(BadOutput, match="all black"):
        check_frames(np.full((2, 8, 8, 3), 2, np.uint8), "seg")
    with pytest.raises(BadOutput, match="one flat colour"):
        check_frames(np.full((2, 8, 8, 3), 128, np.uint8), "seg")
