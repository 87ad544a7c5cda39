"""The job and what is recorded of it: plain records, with no persistence in them.

`Job` (a row of `jobs`), `Event` (of `job_events`), `SegmentRecord` (of `job_segments`) and
`VersionRecord` (of `job_versions`) are what every layer passes around; only factory/db/
reads and writes them (the state machine, composed in factory/db/state.py). They import no
SQLAlchemy. Their ``from_row`` constructors stay here, beside the fields they fill: they
read a row by its column names (``row._mapping`` or attributes), which any row-like object
offers, so they need nothing of the database layer, and code outside it that runs a query
of its own (factory/ops/) builds its jobs the same way.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from factory.spec import VideoSpec, with_joins, with_material
from factory.stages import Action, Stage, allowed_actions


@dataclass(frozen=True)
class Job:
    job_id: str
    batch: str
    spec: dict[str, Any]
    spec_sha256: str
    stage: Stage
    progress: dict[str, Any]
    attempt: int
    recoveries: int
    claimed_by: str | None
    stopped_stage: Stage | None
    last_error: dict[str, Any] | None
    trace_id: str
    heartbeat_at: datetime | None
    created_at: datetime
    updated_at: datetime
    version: int | None = None  # the delivered version published now (job_versions)

    @functools.cached_property
    def video(self) -> VideoSpec:
        """The spec as every stage must read it: as submitted, with the joins between shots
        (factory/plan/rejoin.py) and the pictures and camera moves (factory/plan/material.py)
        redos changed."""
        return self.video_with_material(self.progress.get("material"))

    def video_with_material(self, material: dict[str, Any] | None) -> VideoSpec:
        """The spec with the job's joins and the given swapped material (``progress.material``
        as it was when an operation of the lineage ran: what that operation made segments
        with, factory/pipeline/lineage.py)."""
        from factory.manifest import StoredSpecError

        try:
            joined = with_joins(self.video_as_submitted, self.progress.get("joins"))
        except (KeyError, TypeError, ValueError) as exc:
            raise StoredSpecError(f"job {self.job_id}: progress.joins: {exc}") from exc
        try:
            return with_material(joined, material)
        except (KeyError, TypeError, ValueError) as exc:
            raise StoredSpecError(f"job {self.job_id}: progress.material: {exc}") from exc

    @functools.cached_property
    def video_as_submitted(self) -> VideoSpec:
        """The spec, checked again by the manifest rules: the database is not trusted to
        hold only what `factory submit` wrote (an id with `../` would reach work paths)."""
        from factory.manifest import StoredSpecError, revalidated_spec  # (its rules, once used)

        spec = revalidated_spec(self.spec, self.job_id)
        if spec.batch != self.batch:
            raise StoredSpecError(f"job {self.job_id}: batch {self.batch!r} is not the spec's")
        return spec

    @property
    def video_id(self) -> str:
        return self.video.video_id

    @property
    def actions(self) -> frozenset[Action]:
        """What an operator may do to this job now (factory.stages.allowed_actions)."""
        return allowed_actions(self.stage, redo_to_drop=discardable_redo(self),
                               collected=bool(self.progress.get("gc")))  # fmt: skip

    @classmethod
    def from_row(cls, row: Any) -> Job:
        data = dict(row._mapping)
        data["stage"] = Stage(data["stage"])
        stopped = data["stopped_stage"]
        data["stopped_stage"] = Stage(stopped) if stopped else None
        return cls(**data)


@dataclass(frozen=True)
class Event:
    id: int
    job_id: str
    at: datetime
    stage: Stage
    event: str
    attempt: int
    detail: dict[str, Any]
    trace_id: str


@dataclass(frozen=True)
class SegmentRecord:
    """What the generate stage recorded of one segment (a row of `job_segments`)."""

    index: int
    attempt: int | None  # whose files are the segment (None: named before attempts were)
    seconds: float
    colour: dict[str, Any] | None = None  # the drift check's colour statistics
    seam: dict[str, Any] | None = None  # the seam before this segment, scored when made
    memory: dict[str, Any] | None = None  # GPU memory used while making it
    holder: str | None = None  # the shot holder's lease that made it (in its file names)

    @classmethod
    def from_row(cls, row: Any) -> SegmentRecord:
        return cls(row.segment, row.attempt, row.seconds, row.colour, row.seam, row.memory,
                   row.holder)  # fmt: skip


@dataclass(frozen=True)
class VersionRecord:
    """A delivery of a job (a row of `job_versions`): `pending` while its files are written
    under its own prefix, `delivered` once they are all stored and verified. Never edited
    after that."""

    job_id: str
    version: int
    attempt: int
    state: str
    prefix: str
    outputs: dict[str, str] | None
    segments_from: dict[str, int | None] | None  # {segment: the attempt whose files it holds}
    detail: dict[str, Any]  # kind (first | redo | redelivery), a redo's range and reason
    actor: str
    reserved_at: datetime
    delivered_at: datetime | None

    @property
    def delivered(self) -> bool:
        return self.state == "delivered"

    @classmethod
    def from_row(cls, row: Any) -> VersionRecord:
        return cls(**row._mapping)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "state": self.state,
            "attempt": self.attempt,
            "prefix": self.prefix,
            "outputs": self.outputs or {},
            "segments_from": self.segments_from,
            "actor": self.actor,
            "at": (self.delivered_at or self.reserved_at).isoformat(timespec="seconds"),
            **self.detail,
        }


def discardable_redo(job: Job) -> bool:
    """A redo is running or stopped in this job, recorded with what to put back (redos
    started before that was recorded can only be requeued)."""
    redo = job.progress.get("redo")
    return bool(redo) and "restore" in redo and job.version is not None
