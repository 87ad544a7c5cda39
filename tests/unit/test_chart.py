"""quality.png as the chart painter draws it (factory/qc/chart.py): every shape of report
the qc stage may give it draws a picture, and what it holds is where it should be."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
from PIL import Image

from factory.qc import chart
from factory.qc.pictures import quality_plot

pytestmark = pytest.mark.fast
LIMITS = {"min_vmaf": 70, "min_psnr": 30, "min_ssim": 0.9, "seam_jump": 4}


def series(frames: int, value: float = 80.0) -> dict[str, list[float]]:
    return {"vmaf": [value] * frames, "psnr_y": [40.0] * frames, "ssim": [0.95] * frames,
            "frame": list(range(frames))}  # fmt: skip


def picture(data: bytes) -> np.ndarray:
    image = Image.open(io.BytesIO(data))
    assert image.format == "PNG" and image.width == chart.WIDTH
    return np.asarray(image.convert("RGB"))


def has(pixels: np.ndarray, colour: tuple[int, int, int]) -> bool:
    return bool((pixels == colour).all(axis=-1).any())


def test_a_report_draws_its_lines_seams_limits_and_shaded_defects() -> None:
    seams = [{"seconds": 2.0, "jump": 1.5, "passed": True},
             {"seconds": 4.0, "jump": 6.0, "passed": False, "scene_change": True}]  # fmt: skip
    pixels = picture(quality_plot("v", 12, {"master": series(84), "mobile": series(84, 60)},
                                  seams, LIMITS, {"black": [[1.0, 2.0]]}))  # fmt: skip
    assert has(pixels, chart.SERIES[0]) and has(pixels, chart.SERIES[1])  # two renditions
    assert has(pixels, chart.GREEN) and has(pixels, chart.RED)  # a passed, a failed seam
    # the black run is shaded over every panel, and nowhere past it
    column = pixels[:, int(chart.LEFT + 0.2 * (chart.WIDTH - chart.LEFT - chart.RIGHT))]
    assert (column.sum(axis=-1) < 3 * 240).sum() > 3 * chart.PANEL_HEIGHT


def test_four_panels_without_sound_five_with() -> None:
    quiet = picture(quality_plot("v", 12, {"master": series(24)}, [], LIMITS))
    loud = {"master": {"short_term": [[0.0, -20.0], [1.0, -21.0]], "integrated": -23.0,
                       "range": 2.0, "true_peak": -1.5, "target": -23}}  # fmt: skip
    sound = picture(quality_plot("v", 12, {"master": series(24)}, [], LIMITS, None, loud))
    assert sound.shape[0] - quiet.shape[0] == chart.PANEL_HEIGHT + chart.GAP


@pytest.mark.parametrize(
    "renditions",
    [
        {},  # nothing measured: a note in each fidelity panel
        {"master": series(1)},  # one frame
        {"master": {"vmaf": [80.0, math.nan, 81.0, math.inf], "frame": [0, 1, 2, 3]}},
        {"master": {"vmaf": [math.nan] * 5}},
    ],
)
def test_reports_with_little_or_unmeasured_data_still_draw(renditions: dict) -> None:
    silent = {"a": {"short_term": [], "integrated": -70.0, "range": 0.0, "true_peak": -90.0}}
    picture(quality_plot("v", 16, renditions, [], LIMITS, None, silent))


def test_ticks_are_round_values_across_the_range() -> None:
    assert chart.nice_ticks(0, 100) == [0, 20, 40, 60, 80, 100]
    assert chart.nice_ticks(0.013, 0.987) == [0.2, 0.4, 0.6, 0.8]
    assert chart.nice_ticks(-24.1, -18.9) == [-24, -22, -20]
    assert chart.nice_ticks(5, 5) and chart.nice_ticks(math.nan, 1) == [0.0, 1.0]
