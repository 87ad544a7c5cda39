"""`factory forecast`: will tonight's batch fit its window? From recorded segment timings.

Per video: its segment count (the same plan the workers follow) times the seconds one
segment takes, looked up in this order:

1. history, same family, resolution and segment length (on the named GPU kind if given):
   the median of the recorded `segment.done` seconds;
2. history, same family at other shapes: scaled by pixels x frames from their median rate;
3. the `timed` family's own `seconds_per_segment`;
4. a documented default per family (DEFAULTS below), scaled the same way.

Jobs run whole on one GPU each (a job's segments are sequential), so the batch is scheduled
longest first onto the least-loaded GPU; each job then needs its CPU stages (encode, mux,
QC, delivery), from the recorded seconds per second of video, or a default. The batch ends
when the last job does; it fits if that is before the window closes.
"""

from __future__ import annotations

import heapq
import re
import statistics
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta
from typing import Any

from sqlalchemy import select

from factory.db.models import job_events, jobs
from factory.db.session import Database
from factory.errors import BadInput
from factory.plan.video import video_plan
from factory.spec import VideoSpec


@dataclass(frozen=True)
class Default:
    seconds: float  # one segment of `frames` frames at width x height, on `gpu`
    width: int
    height: int
    frames: int
    gpu: str


# Rough figures for a first night without history (replace them by recording one): a
# 1.3B-parameter Wan/SkyReels transformer at 50 steps, LTX-Video 2B at 40 steps, bf16 with
# flash attention; procedural from bench/pipeline.py (161 frames/s at 640x360 on 2 cores).
DEFAULTS: dict[str, Default] = {
    "wan": Default(150.0, 832, 480, 81, "H100"),
    "skyreels-v2-df": Default(170.0, 960, 544, 97, "H100"),
    "ltx-video": Default(25.0, 768, 512, 121, "H100"),
    # Helios-Distilled as published (19.5 frames/s end to end at 640x384 on an H100; base is
    # about 40x slower: record a night). AnyFlow-FAR publishes no speed: Wan2.1-1.3B's ~3 s
    # per step at 832x480 x 4 steps, scaled to 56 frames, x1.5 for rebuilding its context.
    "helios": Default(152 / 19.5, 640, 384, 152, "H100"),
    "anyflow-far": Default(12.5, 832, 480, 56, "H100"),
    "procedural": Default(0.3, 640, 360, 48, "cpu"),
}
CPU_SECONDS_PER_VIDEO_SECOND = 0.6  # encode + mux + QC + deliver, 3 renditions, 2 cores
CPU_STAGES = ("encode", "mux", "qc", "deliver")


@dataclass(frozen=True)
class Sample:
    family: str
    width: int
    height: int
    frames: int
    gpu: str
    seconds: float

    @property
    def work(self) -> float:
        return self.width * self.height * self.frames


@dataclass
class History:
    samples: list[Sample] = field(default_factory=list)
    cpu_seconds_per_video_second: float | None = None  # median over finished jobs

    @classmethod
    def load(cls, database: Database) -> History:
        with database.connect() as conn:
            details = conn.execute(
                select(job_events.c.detail).where(job_events.c.event == "segment.done")
            ).all()
            finished = conn.execute(
                select(jobs.c.spec, jobs.c.progress).where(jobs.c.stage == "done")
            ).all()
        samples = [s for s in (_sample(row.detail) for row in details) if s is not None]
        rates = []
        for row in finished:
            timings = (row.progress or {}).get("timings", {})
            seconds = [timings.get(stage, {}).get("seconds") for stage in CPU_STAGES]
            duration = float((row.spec or {}).get("duration") or 0)
            if duration > 0 and all(s is not None for s in seconds):
                rates.append(sum(seconds) / duration)
        return cls(samples, statistics.median(rates) if rates else None)


def _sample(detail: dict[str, Any]) -> Sample | None:
    try:
        width, height = (int(v) for v in str(detail["resolution"]).split("x"))
        memory = detail.get("memory") or {}
        return Sample(
            family=str(detail["family"]),
            width=width,
            height=height,
            frames=int(detail["segment_frames"]),
            gpu=str(memory.get("gpu") or memory.get("device") or "cpu"),
            seconds=float(detail["seconds"]),
        )
    except (KeyError, TypeError, ValueError):
        return None


@dataclass(frozen=True)
class Estimate:
    seconds: float
    basis: str  # where the figure comes from, for the operator


def segment_estimate(
    history: History, video: VideoSpec, frames: int, gpu_kind: str | None = None
) -> Estimate:
    family = video.model.family
    if family == "timed" and video.model.seconds_per_segment:
        return Estimate(video.model.seconds_per_segment, "the manifest's seconds_per_segment")
    known = [s for s in history.samples if s.family == family]
    if gpu_kind:
        known = [s for s in known if gpu_kind.lower() in s.gpu.lower()]
    where = f" on {gpu_kind}" if gpu_kind else ""
    same = [
        s for s in known if (s.width, s.height, s.frames) == (video.width, video.height, frames)
    ]
    if same:
        seconds = statistics.median(s.seconds for s in same)
        return Estimate(seconds, f"history: median of {len(same)} segments{where}")
    work = video.width * video.height * frames
    if known:
        rate = statistics.median(s.seconds / s.work for s in known)
        return Estimate(rate * work, f"history: scaled from {len(known)} segments at other sizes")
    default = DEFAULTS.get(family)
    if default is None:
        raise BadInput(f"no history and no default for family {family!r}", field="model.family")
    scale = work / (default.width * default.height * default.frames)
    return Estimate(
        default.seconds * scale,
        f"default: {default.seconds:g} s per {default.frames} frames at "
        f"{default.width}x{default.height} on {default.gpu}, scaled",
    )


@dataclass
class VideoForecast:
    job_id: str
    segments: int
    seconds_per_segment: float
    basis: str
    gpu_seconds: float
    cpu_seconds: float
    gpu: int = 0
    starts_at: float = 0.0  # seconds after the batch starts
    ends_at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Forecast:
    videos: list[VideoForecast]
    gpus: int
    start: datetime
    window_end: datetime | None
    cpu_basis: str

    @property
    def makespan(self) -> float:
        return max((v.ends_at for v in self.videos), default=0.0)

    @property
    def finish(self) -> datetime:
        return self.start + timedelta(seconds=self.makespan)

    @property
    def gpu_hours(self) -> float:
        return sum(v.gpu_seconds for v in self.videos) / 3600

    @property
    def fits(self) -> bool | None:
        return None if self.window_end is None else self.finish <= self.window_end

    @property
    def margin(self) -> float | None:
        """Seconds to spare (negative: over) at the end of the window."""
        if self.window_end is None:
            return None
        return (self.window_end - self.finish).total_seconds()

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus,
            "start": self.start.isoformat(),
            "finish": self.finish.isoformat(),
            "window_end": self.window_end.isoformat() if self.window_end else None,
            "makespan_seconds": round(self.makespan, 1),
            "gpu_hours": round(self.gpu_hours, 3),
            "fits": self.fits,
            "margin_seconds": None if self.margin is None else round(self.margin, 1),
            "cpu_basis": self.cpu_basis,
            "videos": [v.to_dict() for v in self.videos],
        }


def forecast(
    videos: list[VideoSpec],
    history: History,
    *,
    gpus: int,
    start: datetime,
    window_end: datetime | None = None,
    gpu_kind: str | None = None,
) -> Forecast:
    if gpus < 1:
        raise BadInput("must be at least 1", field="--gpus")
    cpu_rate = history.cpu_seconds_per_video_second
    cpu_basis = (
        f"history: {cpu_rate:.2f} s per second of video"
        if cpu_rate is not None
        else f"default: {CPU_SECONDS_PER_VIDEO_SECOND} s per second of video"
    )
    cpu_rate = CPU_SECONDS_PER_VIDEO_SECOND if cpu_rate is None else cpu_rate
    planned = []
    for video in videos:
        plans = video_plan(video)
        estimate = segment_estimate(history, video, video.segment_frames, gpu_kind)
        planned.append(
            VideoForecast(
                job_id=video.job_id,
                segments=len(plans),
                seconds_per_segment=round(estimate.seconds, 3),
                basis=estimate.basis,
                gpu_seconds=round(estimate.seconds * len(plans), 1),
                cpu_seconds=round(cpu_rate * video.duration, 1),
            )
        )
    free = [(0.0, gpu) for gpu in range(gpus)]  # (when the GPU is free, which)
    heapq.heapify(free)
    for item in sorted(planned, key=lambda v: v.gpu_seconds, reverse=True):
        at, gpu = heapq.heappop(free)
        item.gpu, item.starts_at = gpu, at
        item.ends_at = at + item.gpu_seconds + item.cpu_seconds
        heapq.heappush(free, (at + item.gpu_seconds, gpu))
    return Forecast(planned, gpus, start, window_end, cpu_basis)


def time_left(
    video: VideoSpec,
    progress: dict[str, Any],
    pace: tuple[int, float] | None,
    estimate: float,
    cpu_rate: float,
) -> float:
    """Seconds of work an unfinished job has left: the one rule behind every ETA (the
    console's and the API's batch ETA, `factory watch`). Its segments still to make, at its
    own measured pace once it has made one (`pace`: segments made, seconds they took), else
    at `estimate` (segment_estimate for its shape); then its CPU stages at `cpu_rate`
    seconds per second of video."""
    todo = max(0, progress.get("segments_total", 0) - len(progress.get("segments", [])))
    made, seconds = pace or (0, 0.0)
    per_segment = seconds / made if made else estimate
    return todo * per_segment + cpu_rate * video.duration


def makespan(seconds: list[float], gpus: int) -> float:
    """How long `seconds` of sequential work items take on `gpus` GPUs, longest first."""
    free = [0.0] * max(1, gpus)
    for item in sorted(seconds, reverse=True):
        heapq.heapreplace(free, free[0] + item)
    return max(free)


def gpus_needed(videos: list[VideoSpec], history: History, start: datetime, end: datetime,
                gpu_kind: str | None = None, most: int = 64) -> int | None:  # fmt: skip
    """The fewest GPUs with which the batch ends by `end`; None if no number of GPUs would do
    (the longest video alone runs past `end`: a job's segments run one after another)."""
    alone = forecast(videos, history, gpus=max(1, len(videos)), start=start, window_end=end,
                     gpu_kind=gpu_kind)  # fmt: skip
    if not alone.fits:
        return None
    for count in range(1, most + 1):
        if forecast(videos, history, gpus=count, start=start, window_end=end,
                    gpu_kind=gpu_kind).fits:  # fmt: skip
            return count
    return None


def parse_window(text: str, now: datetime) -> tuple[datetime, datetime]:
    """`22:00-06:00` -> (start, end) of the next such window, or of the current one if `now`
    is inside it (then the start is `now`). Windows may cross midnight."""
    match = re.fullmatch(r"\s*(\d{1,2}:\d{2})\s*-\s*(\d{1,2}:\d{2})\s*", text)
    try:
        if match is None:
            raise ValueError(text)
        first, second = (time.fromisoformat(part.zfill(5)) for part in match.groups())
    except ValueError:
        raise BadInput(f"must be HH:MM-HH:MM, got {text!r}", field="--window") from None
    if first == second:
        raise BadInput("start and end are the same time", field="--window")
    for day in (now.date() - timedelta(days=1), now.date(), now.date() + timedelta(days=1)):
        begin = datetime.combine(day, first, now.tzinfo)
        end = datetime.combine(day + timedelta(days=1 if second <= first else 0), second,
                               now.tzinfo)  # fmt: skip
        if begin <= now < end:
            return now, end
        if now < begin:
            return begin, end
    raise AssertionError("unreachable: a window recurs daily")
