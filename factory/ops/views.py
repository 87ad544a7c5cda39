"""What the operations layer shows of batches and jobs: the views every interface renders (the
CLI's tables and `--json`, the API's documents, the console's pages), one shape each."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from factory.job import Event, Job, SegmentRecord, VersionRecord
from factory.ops.forecast import Forecast
from factory.ops.retention import gc_note
from factory.plan.video import video_shots
from factory.qc.thresholds import QcThresholds
from factory.spec import VideoSpec
from factory.stages import Stage


@dataclass(frozen=True)
class Page:
    items: list[Any]
    next_cursor: str | None  # pass as `after` for the next page; None: this was the last


@dataclass(frozen=True)
class BatchView:
    batch: str
    created_at: datetime
    review: bool
    by_stage: dict[str, int]
    frames_done: int
    frames_total: int
    eta: datetime | None = None  # when the unfinished jobs should be done (forecast)

    @property
    def total(self) -> int:
        return sum(self.by_stage.values())

    def count(self, *stages: Stage) -> int:
        return sum(self.by_stage.get(s.value, 0) for s in stages)

    @property
    def finished(self) -> bool:
        return self.count(Stage.DONE, Stage.FAILED, Stage.CANCELLED) == self.total

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "created_at": self.created_at.isoformat(),
            "review": self.review,
            "jobs": self.total,
            "by_stage": self.by_stage,
            "delivered": self.count(Stage.DONE),
            "failed": self.count(Stage.FAILED),
            "cancelled": self.count(Stage.CANCELLED),
            "waiting_review": self.count(Stage.REVIEW),
            "frames_done": self.frames_done,
            "frames_total": self.frames_total,
            "eta": self.eta.isoformat() if self.eta else None,
        }


@dataclass(frozen=True)
class BatchForecast:
    forecast: Forecast
    gpus_needed: int | None  # with a window it misses: the fewest GPUs that would make it
    recorded: int  # segments of history it is based on


@dataclass(frozen=True)
class JobView:
    """A job in full: what `factory status` prints and the console's video page shows."""

    job: Job
    segments: dict[int, SegmentRecord]
    checks: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # from the QC report
    versions: list[VersionRecord] = field(default_factory=list)  # delivered, oldest first
    review_candidate: dict[str, int] | None = None  # in review: {attempt, version}

    @property
    def current(self) -> VersionRecord | None:
        """The version published now (None before the first delivery)."""
        return next((v for v in self.versions if v.version == self.job.version), None)

    @property
    def outputs(self) -> dict[str, str]:
        current = self.current
        return dict(current.outputs or {}) if current else {}

    @property
    def seams(self) -> list[dict[str, Any]]:
        # records from before the seam dict named its segment lack the key
        return [{"seam": i, **r.seam} for i, r in sorted(self.segments.items()) if r.seam]

    def worst_seams(self, limits: QcThresholds) -> list[dict[str, Any]]:
        """The seams, failed ones first, then by how near they came to failing (`score`:
        the largest measure over its limit, 1.0 at the limit)."""
        cells = [
            seam | {"score": round(limits.seam_score(seam), 3),
                    "failed": bool(seam.get("failures")) or seam.get("passed") is False}
            for seam in self.seams
        ]  # fmt: skip
        return sorted(cells, key=lambda c: (not c["failed"], -c["score"], c["seam"]))

    def to_dict(self) -> dict[str, Any]:
        job = self.job
        return job_summary(job) | {
            "video_id": job.spec.get("video_id"),
            "spec": job.spec,
            "trace_id": job.trace_id,
            "claimed_by": job.claimed_by,
            "recoveries": job.recoveries,
            "timings": job.progress.get("timings", {}),
            "version": job.version,
            "outputs": self.outputs,
            "versions": [v.to_dict() for v in self.versions],
            "review_candidate": self.review_candidate,
            "qc": job.progress.get("qc"),
            "review": job.progress.get("review"),
            "gc": gc_note(job),
            "seams": self.seams,
            "checks": self.checks,
            "actions": sorted(job.actions),
            "segments_made": [  # every segment's whole record
                {k: v for k, v in dataclasses.asdict(r).items() if v is not None}
                for _, r in sorted(self.segments.items())
            ],
        }


def job_summary(job: Job) -> dict[str, Any]:
    return {
        "job_id": job.job_id,
        "batch": job.batch,
        "stage": job.stage.value,
        "stopped_stage": job.stopped_stage.value if job.stopped_stage else None,
        "attempt": job.attempt,
        "progress": job.progress,
        "last_error": job.last_error,
        "heartbeat_at": iso(job.heartbeat_at),
        "created_at": iso(job.created_at),
        "updated_at": iso(job.updated_at),
    }


def event_dict(event: Event) -> dict[str, Any]:
    return {
        "id": event.id,
        "job_id": event.job_id,
        "at": iso(event.at),
        "stage": event.stage.value,
        "event": event.event,
        "attempt": event.attempt,
        "detail": event.detail,
        "trace_id": event.trace_id,
    }


# Jobs past generation count all their frames as made (failed ones count what they made).


def iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def shot_rows(video: VideoSpec) -> list[dict[str, Any]]:
    """The video's shots as `factory validate` lists them: where each starts and ends (the
    frames it owns), how it joins the one before, its scenes and segments."""
    rows = []
    for shot in video_shots(video):
        scene = video.scenes[shot.scenes[0]]
        join = shot.join.kind
        if shot.join.is_transition:
            join = f"{join} {scene.transition_seconds:g} s"
        rows.append({
            "shot": shot.index,
            "start": round(shot.start / video.fps, 3),
            "end": round(shot.end / video.fps, 3),
            "join": join,
            "scenes": list(shot.scenes),
            "segments": [shot.segments[0].index, shot.segments[-1].index],
        })  # fmt: skip
    return rows


def material_rows(video: VideoSpec) -> list[tuple[str, str]]:
    """The material a video brings, for people (`factory status`, the console's video page):
    each scene's picture, the bed, the cues and the loudness target, by their store keys."""
    rows = [
        ("picture", f"scene {k} {scene.image.role}: {scene.image.asset}")
        for k, scene in enumerate(video.scenes)
        if scene.image is not None
    ] + [
        ("camera", f"scene {k}: {scene.camera.asset} (strength {scene.camera.strength:g}, "
                   f"{scene.camera.fit})")
        for k, scene in enumerate(video.scenes)
        if scene.camera is not None
    ]  # fmt: skip
    audio = video.audio
    if audio is None:
        return rows
    if audio.asset is not None:
        rows.append(("bed", f"{audio.asset} ({audio.gain_db:+g} dB, "
                            f"{'looped' if audio.loop else 'once'})"))  # fmt: skip
    for cue in audio.cues:
        rows.append(("cue", f"at {cue.at:g} s: {cue.asset} ({cue.gain_db:+g} dB)"))
    if audio.loudness is not None:
        target = audio.loudness
        named = f" ({target.profile})" if target.profile else ""
        rows.append(("loudness", f"{target.integrated:g} LUFS, true peak at most "
                                 f"{target.true_peak:g} dBTP{named}"))  # fmt: skip
    return rows


# What a GPU node warms first (`factory preload`): the source design's order, camera moves
# first, then transitions and localised sound, then user sound by how often batches use
# it. Here: what generation reads (scene pictures, LoRA adapters), then the cues (localised
# sound), then the beds, the ones more videos use first. Camera templates come first.
PRELOAD_TIERS = ("camera", "picture", "lora", "cue", "bed")


def preload_order(videos: Sequence[VideoSpec]) -> list[tuple[str, str]]:
    """Every asset the videos reference, once, as (reference, kind), in the order a node
    warms them: by PRELOAD_TIERS, beds by how many of the videos use them (most first),
    ties in the order the manifest gives them."""
    tier: dict[str, int] = {}
    first: dict[str, int] = {}
    uses: dict[str, int] = {}
    for video in videos:
        kinds = [*((s.camera.asset, "camera") for s in video.scenes if s.camera is not None),
                 *((s.image.asset, "picture") for s in video.scenes if s.image is not None),
                 *((lora.asset, "lora") for lora in video.model.loras)]  # fmt: skip
        if video.audio is not None:
            kinds += [(cue.asset, "cue") for cue in video.audio.cues]
            kinds += [(video.audio.asset, "bed")] if video.audio.asset else []
        for reference, kind in dict.fromkeys(kinds):
            uses[reference] = uses.get(reference, 0) + 1
            tier[reference] = min(tier.get(reference, len(PRELOAD_TIERS)),
                                  PRELOAD_TIERS.index(kind))  # fmt: skip
            first.setdefault(reference, len(first))

    def order(reference: str) -> tuple[int, int, int]:
        by_use = -uses[reference] if PRELOAD_TIERS[tier[reference]] == "bed" else 0
        return tier[reference], by_use, first[reference]

    return [(reference, PRELOAD_TIERS[tier[reference]]) for reference in sorted(first, key=order)]
