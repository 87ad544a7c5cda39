"""The state machine's reads: a job, jobs, their timeline, segments and versions, and what a
job in review would publish. Each in a transaction of its own; none writes.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import func, select

from factory.db.core import MachineCore
from factory.db.models import batches, job_events, job_segments, job_versions, jobs
from factory.job import Event, Job, SegmentRecord, VersionRecord
from factory.stages import Stage


class Reads(MachineCore):
    """Reading jobs and what is recorded of them: no write, no fence."""

    # --- reading ----------------------------------------------------------------------

    def get(self, job_id: str) -> Job:
        with self.database.transaction() as conn:
            return self._read(conn, job_id)

    def find(self, job_ids: Iterable[str]) -> dict[str, Job]:
        ids = list(job_ids)
        with self.database.transaction() as conn:
            rows = conn.execute(select(jobs).where(jobs.c.job_id.in_(ids))).all()
        return {row.job_id: Job.from_row(row) for row in rows}

    def list_jobs(
        self, *, batch: str | None = None, stage: Stage | None = None, limit: int = 1000
    ) -> list[Job]:
        query = select(jobs).order_by(jobs.c.created_at, jobs.c.job_id).limit(limit)
        if batch is not None:
            query = query.where(jobs.c.batch == batch)
        if stage is not None:
            query = query.where(jobs.c.stage == stage.value)
        with self.database.transaction() as conn:
            return [Job.from_row(row) for row in conn.execute(query)]

    def events(self, job_id: str) -> list[Event]:
        with self.database.transaction() as conn:
            self._read(conn, job_id)
            rows = conn.execute(
                select(job_events).where(job_events.c.job_id == job_id).order_by(job_events.c.id)
            )
            return [Event(**{**row._mapping, "stage": Stage(row.stage)}) for row in rows]

    def segments(self, job_id: str) -> dict[int, SegmentRecord]:
        """Every segment the job's current run recorded, by index."""
        with self.database.transaction() as conn:
            rows = conn.execute(
                select(job_segments)
                .where(job_segments.c.job_id == job_id)
                .order_by(job_segments.c.segment)
            )
            return {row.segment: SegmentRecord.from_row(row) for row in rows}

    def versions(self, job_id: str, *, delivered_only: bool = True) -> list[VersionRecord]:
        """The job's versions in order (only delivered ones unless told otherwise)."""
        query = (
            select(job_versions)
            .where(job_versions.c.job_id == job_id)
            .order_by(job_versions.c.version)
        )
        if delivered_only:
            query = query.where(job_versions.c.state == "delivered")
        with self.database.transaction() as conn:
            return [VersionRecord.from_row(row) for row in conn.execute(query)]

    def current_versions(self, job_ids: Iterable[str]) -> dict[str, VersionRecord]:
        """{job: its current (published) version}, in one query."""
        ids = list(job_ids)
        if not ids:
            return {}
        query = (
            select(job_versions)
            .join(
                jobs,
                (jobs.c.job_id == job_versions.c.job_id)
                & (jobs.c.version == job_versions.c.version),
            )
            .where(jobs.c.job_id.in_(ids))
        )
        with self.database.transaction() as conn:
            return {row.job_id: VersionRecord.from_row(row) for row in conn.execute(query)}

    def segment(self, job_id: str, index: int) -> SegmentRecord | None:
        with self.database.transaction() as conn:
            row = conn.execute(
                select(job_segments).where(
                    job_segments.c.job_id == job_id, job_segments.c.segment == index
                )
            ).first()
            return SegmentRecord.from_row(row) if row is not None else None

    def segment_seconds(self, job_ids: Iterable[str]) -> dict[str, tuple[int, float]]:
        """{job: (segments recorded, their generation seconds summed)}, in one query."""
        ids = list(job_ids)
        if not ids:
            return {}
        query = (
            select(job_segments.c.job_id, func.count(), func.sum(job_segments.c.seconds))
            .where(job_segments.c.job_id.in_(ids))
            .group_by(job_segments.c.job_id)
        )
        with self.database.transaction() as conn:
            return {job: (int(n), float(total or 0.0)) for job, n, total in conn.execute(query)}

    def next_version(self, job_id: str) -> int:
        """The number the job's next delivery will take (what a redo plan predicts)."""
        with self.database.transaction() as conn:
            return self._next_version(conn, self._read(conn, job_id))

    # --- review (a batch with `review: required`) -------------------------------------

    def requires_review(self, batch: str) -> bool:
        with self.database.transaction() as conn:
            found = conn.execute(select(batches.c.review).where(batches.c.batch == batch))
            return bool(found.scalar())

    def review_candidate(self, job_id: str) -> dict[str, int] | None:
        """What a job in review would publish: its attempt and the version it would be
        delivered as (a reviewer's decision names both, and is refused if either moved)."""
        with self.database.transaction() as conn:
            job = self._read(conn, job_id)
            if job.stage is not Stage.REVIEW:
                return None
            return {"attempt": job.attempt, "version": self._next_version(conn, job)}
