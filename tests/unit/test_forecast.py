"""The batch forecast: windows, scheduling, and where each per-segment figure comes from."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from factory.errors import BadInput
from factory.manifest import parse_manifest
from factory.ops.forecast import (
    DEFAULTS,
    History,
    Sample,
    forecast,
    gpus_needed,
    makespan,
    parse_window,
    segment_estimate,
    time_left,
)

TZ = timezone(timedelta(hours=1))


def at(day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 11, day, hour, minute, tzinfo=TZ)


@pytest.mark.parametrize(
    ("now", "start", "end"),
    [
        (at(29, 21, 30), at(29, 22), at(30, 6)),  # before tonight's window
        (at(29, 23, 15), at(29, 23, 15), at(30, 6)),  # inside, before midnight
        (at(30, 2, 0), at(30, 2, 0), at(30, 6)),  # inside, after midnight
        (at(30, 7, 0), at(30, 22), datetime(2026, 12, 1, 6, tzinfo=TZ)),  # after: tomorrow
    ],
)
def test_windows_cross_midnight_and_start_now_when_inside(now, start, end) -> None:
    assert parse_window("22:00-06:00", now) == (start, end)


def test_a_daytime_window_and_bad_windows() -> None:
    assert parse_window("09:00-17:30", at(29, 8)) == (at(29, 9), at(29, 17, 30))
    for bad in ("22-06", "22:00", "25:00-06:00", "06:00-06:00"):
        with pytest.raises(BadInput, match="--window"):
            parse_window(bad, at(29, 8))


def test_longest_jobs_first_onto_the_least_loaded_gpu() -> None:
    # 5 | 4 -> 5 | 7 -> 8 | 7 -> 8 | 10: what a worker pool does when the longest jobs are
    # sent first (the best split, 9 | 9, needs foresight LPT does not have: within 4/3)
    assert makespan([5, 4, 3, 3, 3], 2) == 10
    assert makespan([10, 1, 1], 3) == 10
    assert makespan([], 4) == 0


def video(shape: str = "832x480", frames: int = 81, family: str = "wan", duration: float = 60):
    overlap = 5 if family == "wan" else 8
    model = (
        "{family: timed, seconds_per_segment: 2.5}"
        if family == "timed"
        else f"{{family: {family}, path: /models/x}}"
        if family != "procedural"
        else "procedural"
    )
    text = (
        f"batch: b\nvideos:\n  - id: v\n    prompt: p\n    duration: {duration}\n    fps: 16\n"
        f"    resolution: {shape}\n    segment: {{frames: {frames}, overlap: {overlap}}}\n"
        f"    model: {model}\n"
    )
    return parse_manifest(text).videos[0]


def test_the_estimate_prefers_exact_history_then_scaled_history_then_defaults() -> None:
    history = History(
        [Sample("wan", 832, 480, 81, "NVIDIA H100 80GB HBM3", s) for s in (100, 110, 300)]
        + [Sample("wan", 832, 480, 81, "NVIDIA A100-SXM4-80GB", 200)]
    )
    exact = segment_estimate(history, video(), 81)
    assert (exact.seconds, exact.basis) == (155.0, "history: median of 4 segments")
    on_h100 = segment_estimate(history, video(), 81, gpu_kind="H100")
    assert on_h100.seconds == 110 and "on H100" in on_h100.basis
    scaled = segment_estimate(history, video("416x240"), 81)  # a quarter of the pixels
    assert scaled.seconds == pytest.approx(155.0 / 4) and "scaled" in scaled.basis
    fallback = segment_estimate(History(), video(), 81)
    assert fallback.seconds == DEFAULTS["wan"].seconds and fallback.basis.startswith("default")
    timed = segment_estimate(history, video(family="procedural"), 48)
    assert timed.basis.startswith("default")
    assert segment_estimate(History(), video(family="timed", frames=16), 16).seconds == 2.5


def test_fits_or_not_and_how_many_gpus_would_fit() -> None:
    history = History([Sample("wan", 832, 480, 81, "H100", 100.0)], 0.5)
    videos = [video(duration=60)] * 8  # 13 segments each at 100 s: 1300 s of GPU each
    start, end = at(29, 22), at(29, 23)  # one hour
    one = forecast(videos, history, gpus=1, start=start, window_end=end)
    assert one.videos[0].segments == 13 and one.gpu_hours == pytest.approx(8 * 1300 / 3600)
    assert one.fits is False and one.margin < 0
    assert one.makespan == pytest.approx(8 * 1300 + 30)  # the last job's CPU stages follow
    assert gpus_needed(videos, history, start, end) == 4  # 2 jobs each: 2630 s < 3600 s
    four = forecast(videos, history, gpus=4, start=start, window_end=end)
    assert four.fits and {v.gpu for v in four.videos} == {0, 1, 2, 3}
    assert "history: 0.50 s per second" in four.cpu_basis
    assert forecast(videos, history, gpus=2, start=start).fits is None  # no window given


def test_time_left_is_the_job_s_own_pace_once_it_has_one_else_the_estimate() -> None:
    """The one rule behind the console's ETA and `factory watch` (issue 36)."""
    video = parse_manifest(
        "batch: b\ndefaults: {duration: 10, fps: 12, segment: {frames: 24, overlap: 4}}\n"
        "videos: [{id: v, prompt: p}]\n",
        source="test",
    ).videos[0]
    progress = {"segments_total": 6, "segments": [0, 1]}
    assert time_left(video, progress, (2, 30.0), estimate=99.0, cpu_rate=0.5) == 4 * 15 + 5
    assert time_left(video, progress, None, estimate=20.0, cpu_rate=0.5) == 4 * 20 + 5
    assert time_left(video, progress | {"segments": list(range(6))}, (6, 60.0), 20.0, 0.0) == 0
