"""The job state machine: the only code that writes a job's stage.

Workers hold an ``attempt`` number as a fencing token. A claim bumps it with a
compare-and-set; every later write by that worker carries ``AND attempt = :mine``, so a
writer holding a stale attempt (a duplicate delivery, a worker the sweeper gave up on, a
job an operator cancelled or requeued) changes nothing and gets ``StaleAttempt``.

Operator actions (``cancel``, ``requeue``) bump the attempt too, which is how a running
worker learns at its next checkpoint or heartbeat that it must stop. Every change is
appended to ``job_events`` with the job's trace id, in the same transaction.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, delete, func, insert, select, text, tuple_, update

from factory.db.models import batches, job_events, job_segments, job_versions, jobs, utcnow
from factory.db.session import Database
from factory.errors import (
    BadInput,
    IllegalTransition,
    InvalidOperation,
    NoSuchJob,
    StaleAttempt,
)
from factory.infra.redact import redact, redact_value
from factory.job import Event, Job, SegmentRecord, VersionRecord, discardable_redo
from factory.plan import segment_count
from factory.redo import give
from factory.spec import VideoSpec
from factory.stages import (
    ACTIVE,
    REQUEUE_TARGETS,
    Action,
    Stage,
    initial_progress,
    is_legal,
    order,
    reset_progress,
)

Clock = Callable[[], datetime]
# (job_id, stage, attempt) of a message waiting in the broker that would advance that job
WaitingMessage = tuple[str, str, int]


@dataclass(frozen=True)
class Created:
    job: Job
    created: bool  # False: the same spec was already there


class JobStateMachine:
    """Writes take their timestamps from the database's clock (PostgreSQL's
    ``clock_timestamp()``), not the writer's: heartbeats written on one node are compared with
    the sweeper's threshold on another, and a node whose clock is off by minutes must neither
    look dead nor keep a dead job looking alive. SQLite (embedded: one machine) uses the local
    clock. Tests may pass a ``clock`` to drive time themselves."""

    def __init__(self, database: Database, clock: Clock | None = None) -> None:
        self.database = database
        self.clock = clock

    def now(self, conn: Connection) -> datetime:
        if self.clock is not None:
            return self.clock()
        if conn.dialect.name == "postgresql":
            return conn.execute(select(func.clock_timestamp())).scalar_one()
        return utcnow()

    def _now_sql(self, conn: Connection) -> Any:
        """Now as a value for a statement, without a round trip of its own: PostgreSQL's
        ``statement_timestamp()`` (one value per statement, by the server's clock)."""
        if self.clock is None and conn.dialect.name == "postgresql":
            return func.statement_timestamp()
        return self.now(conn)

    def current_time(self) -> datetime:
        """Now, by the database's clock (what every recorded timestamp is compared with)."""
        with self.database.transaction() as conn:
            return self.now(conn)

    # --- reading -----------------------------------------------------------------

    def get(self, job_id: str) -> Job:
        with self.database.transaction() as conn:
            return self._read(conn, job_id)

    def find(self, job_ids: Iterable[str]) -> dict[str, Job]:
        ids = list(job_ids)
        with self.database.transaction() as conn:
            rows = conn.execute(select(jobs).where(jobs.c.job_id.in_(ids))).all()
        return {row.job_id: Job.from_row(row) for row in rows}

    def mark_batch_notified(self, batch: str) -> bool:
        """Compare-and-set of `batches.notified_at`: True for the one caller that sets it."""
        with self.database.transaction() as conn:
            done = conn.execute(
                update(batches)
                .where(batches.c.batch == batch, batches.c.notified_at.is_(None))
                .values(notified_at=self.now(conn))
            )
            return done.rowcount == 1

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

    # --- creating ----------------------------------------------------------------

    def create(
        self,
        conn: Connection,
        source: str,
        videos: Iterable[VideoSpec],
        *,
        review: bool = False,
        actor: str = "",
    ) -> list[Created]:
        """Insert the batch and its jobs at `queued` inside the caller's transaction.

        Rows that already exist are left alone (``INSERT … ON CONFLICT DO NOTHING``, so
        concurrent submitters of the same manifest wait on each other and create each job
        once); the caller compares ``spec_sha256`` to tell a resubmission from a conflict.
        """
        now = self.now(conn)
        videos = list(videos)
        insert_for = _insert_for(conn)
        for batch_name in dict.fromkeys(v.batch for v in videos):
            conn.execute(
                insert_for(batches)
                .values(batch=batch_name, source=source, created_at=now, review=review)
                .on_conflict_do_nothing(index_elements=["batch"])
            )
        created: list[Created] = []
        for video in videos:
            frames = video.frames_total
            segments = segment_count(
                frames, video.segment_frames, video.segment_overlap, video.first_segment_short
            )
            trace_id = uuid.uuid4().hex
            inserted = conn.execute(
                insert_for(jobs)
                .values(
                    job_id=video.job_id,
                    batch=video.batch,
                    spec=video.to_dict(),
                    spec_sha256=video.sha256(),
                    stage=Stage.QUEUED.value,
                    progress={
                        **initial_progress(frames, segments),
                        "timings": {Stage.QUEUED.value: {"started_at": now.isoformat()}},
                    },
                    attempt=0,
                    recoveries=0,
                    trace_id=trace_id,
                    created_at=now,
                    updated_at=now,
                )
                .on_conflict_do_nothing(index_elements=["job_id"])
                .returning(jobs.c.job_id)
            ).first()
            if inserted is not None:
                self._event(
                    conn,
                    video.job_id,
                    Stage.QUEUED,
                    "submitted",
                    0,
                    trace_id,
                    {
                        "source": source,
                        "frames_total": frames,
                        "segments_total": segments,
                        **_by(actor),
                    },
                )
            job = self._read(conn, video.job_id)
            created.append(Created(job=job, created=inserted is not None))
        return created

    # --- worker actions (fenced by attempt) --------------------------------------

    def claim(self, job_id: str, *, seen_attempt: int, worker: str) -> Job:
        """Take the job for a new attempt; the returned job's ``attempt`` is the caller's token."""
        with self.database.transaction() as conn:
            if self.clock is None and conn.dialect.name == "postgresql":
                found = conn.execute(
                    _CLAIM,
                    {
                        "job_id": job_id,
                        "seen": seen_attempt,
                        "worker": worker,
                        "detail": json.dumps(redact_value({"worker": worker})),
                    },
                ).first()
                if found is None:
                    raise self._fenced(conn, job_id, seen_attempt)
                return Job.from_row(found)
            now = self._now_sql(conn)
            row = conn.execute(
                update(jobs)
                .where(jobs.c.job_id == job_id, jobs.c.attempt == seen_attempt)
                .where(jobs.c.stage.in_([s.value for s in ACTIVE]))
                .values(
                    attempt=jobs.c.attempt + 1, claimed_by=worker, heartbeat_at=now, updated_at=now
                )
                .returning(*jobs.c)
            ).first()
            if row is None:
                raise self._fenced(conn, job_id, seen_attempt)
            job = Job.from_row(row)
            self._event(conn, job_id, job.stage, "claimed", job.attempt, job.trace_id,
                        {"worker": worker}, at=job.updated_at)  # fmt: skip
            return job

    def transition(
        self, job_id: str, *, attempt: int, to: Stage, detail: dict[str, Any] | None = None
    ) -> Job:
        with self.database.transaction() as conn:
            job = self._held(conn, job_id, attempt)
            if not is_legal(job.stage, to):
                raise IllegalTransition(job_id, job.stage.value, to.value)
            now = self.now(conn)
            progress = _with_timing(job.progress, job.stage, to, now)
            values: dict[str, Any] = {
                "stage": to.value,
                "progress": progress,
                "updated_at": now,
                "heartbeat_at": now,
                "recoveries": 0,  # counted since the last progress, not over the job's life
            }
            if to in (Stage.FAILED, Stage.CANCELLED):
                values["stopped_stage"] = job.stage.value
            self._fenced_update(conn, job_id, attempt, values, expected_stage=job.stage)
            event = {Stage.FAILED: "failed", Stage.CANCELLED: "cancelled"}.get(to, "advanced")
            self._event(
                conn,
                job_id,
                to,
                event,
                attempt,
                job.trace_id,
                {"from": job.stage.value, **(detail or {})},
            )
            return self._read(conn, job_id)

    def checkpoint(
        self,
        job_id: str,
        *,
        attempt: int,
        updates: dict[str, Any],
        event: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> Job:
        """Replace top-level progress keys; optionally record an event on the timeline.

        Recording work (non-empty ``updates``) is progress: the counts of recoveries and
        interruptions start again from zero."""
        with self.database.transaction() as conn:
            job = self._held(conn, job_id, attempt)
            now = self.now(conn)
            progress = {**job.progress, **updates}
            values: dict[str, Any] = {"progress": progress, "updated_at": now, "heartbeat_at": now}
            if updates:
                progress.pop("interrupted", None)
                values["recoveries"] = 0
            self._fenced_update(conn, job_id, attempt, values, expected_stage=job.stage)
            if event:
                self._event(conn, job_id, job.stage, event, attempt, job.trace_id, detail or {})
            return self._read(conn, job_id)

    def record_segment(
        self,
        job_id: str,
        *,
        attempt: int,
        record: SegmentRecord,
        updates: dict[str, Any],
        detail: dict[str, Any],
    ) -> Job:
        """A segment made and stored: its row in `job_segments`, its index in
        ``progress.segments`` with ``updates``, and the `segment.done` event, in one fenced
        transaction. The per-segment details live in their own rows, so the cost does not
        grow with the segments already done."""
        with self.database.transaction() as conn:
            if (
                self.clock is None
                and conn.dialect.name == "postgresql"
                and "segments" not in updates
            ):
                found = conn.execute(
                    _RECORD_SEGMENT,
                    {
                        "job_id": job_id,
                        "attempt": attempt,
                        "index": record.index,
                        "updates": json.dumps(updates),
                        "made_by": record.attempt,
                        "seconds": record.seconds,
                        "colour": _json_or_none(record.colour),
                        "seam": _json_or_none(record.seam),
                        "memory": _json_or_none(record.memory),
                        "detail": json.dumps(redact_value(detail)),
                    },
                ).first()
                if found is not None:
                    return Job.from_row(found)
            job = self._held(conn, job_id, attempt)  # fenced out, or not the next segment
            progress = {
                **job.progress,
                **updates,
                "segments": sorted({*job.progress["segments"], record.index}),
            }
            progress.pop("interrupted", None)
            now = self._now_sql(conn)
            row = conn.execute(
                update(jobs)
                .where(jobs.c.job_id == job_id, jobs.c.attempt == attempt)
                .where(jobs.c.stage == job.stage.value)
                .values(progress=progress, updated_at=now, heartbeat_at=now, recoveries=0)
                .returning(*jobs.c)
            ).first()
            if row is None:
                raise self._fenced(conn, job_id, attempt)
            now = row.updated_at
            values = {
                "attempt": record.attempt,
                "seconds": record.seconds,
                "colour": record.colour,
                "seam": record.seam,
                "memory": record.memory,
                "made_at": now,
            }
            conn.execute(
                _insert_for(conn)(job_segments)
                .values(job_id=job_id, segment=record.index, **values)
                .on_conflict_do_update(index_elements=["job_id", "segment"], set_=values)
            )
            self._event(conn, job_id, job.stage, "segment.done", attempt, job.trace_id, detail,
                        at=now)  # fmt: skip
            return Job.from_row(row)

    def heartbeat(self, job_id: str, *, attempt: int) -> None:
        with self.database.transaction() as conn:
            now = self._now_sql(conn)
            result = conn.execute(
                update(jobs)
                .where(jobs.c.job_id == job_id, jobs.c.attempt == attempt)
                .where(jobs.c.stage.in_([s.value for s in ACTIVE]))
                .values(heartbeat_at=now, updated_at=now)
            )
            if result.rowcount == 0:
                raise self._fenced(conn, job_id, attempt)

    def fail(
        self,
        job_id: str,
        *,
        attempt: int,
        kind: str,
        message: str,
        detail: dict[str, Any] | None = None,
    ) -> Job:
        """Stop the job in `failed`, keeping where it stopped and why for `status` and `requeue`."""
        with self.database.transaction() as conn:
            job = self._held(conn, job_id, attempt)
            if not is_legal(job.stage, Stage.FAILED):
                raise IllegalTransition(job_id, job.stage.value, Stage.FAILED.value)
            return self._fail_held(conn, job, self.now(conn), kind, message, detail or {})

    def _fail_held(
        self,
        conn: Connection,
        job: Job,
        now: datetime,
        kind: str,
        message: str,
        detail: dict[str, Any],
    ) -> Job:
        message = redact(message)
        error = {
            "stage": job.stage.value,
            "kind": kind,
            "message": message,
            "at": now.isoformat(),
            "attempt": job.attempt,
            **detail,
        }
        values = {
            "stage": Stage.FAILED.value,
            "stopped_stage": job.stage.value,
            "last_error": error,
            "updated_at": now,
            "progress": _with_timing(job.progress, job.stage, Stage.FAILED, now),
        }
        self._fenced_update(conn, job.job_id, job.attempt, values, expected_stage=job.stage)
        self._event(
            conn,
            job.job_id,
            Stage.FAILED,
            "failed",
            job.attempt,
            job.trace_id,
            {"from": job.stage.value, "kind": kind, "message": message, **detail},
            at=now,
        )
        return self._read(conn, job.job_id)

    def release(self, job_id: str, *, attempt: int, reason: str) -> Job:
        """The holder hands the job back (a worker shutting down): no one holds it now."""
        with self.database.transaction() as conn:
            job = self._held(conn, job_id, attempt)
            now = self.now(conn)
            self._fenced_update(
                conn, job_id, attempt,
                {"claimed_by": None, "heartbeat_at": None, "updated_at": now},
                expected_stage=job.stage,
            )  # fmt: skip
            self._event(conn, job_id, job.stage, "released", attempt, job.trace_id,
                        {"reason": reason, "worker": job.claimed_by})  # fmt: skip
            return self._read(conn, job_id)

    def interrupt(
        self,
        job_id: str,
        *,
        attempt: int,
        reason: str,
        kind: str = "RetryableError",
        give_up_after: float | None = None,
        advice: str = "",
    ) -> Job:
        """The holder stops on an infrastructure fault (a store or gateway down, a time limit):
        the job keeps its stage and progress, no one holds it, and the sweeper resumes it after
        FACTORY_STALE_AFTER. `progress.interrupted` says why, since when and how often.

        Interruptions are bounded by time without progress: once the job has been interrupted
        for ``give_up_after`` seconds with no work recorded in between, it fails with the
        fault's kind and the advice (a fault that never heals must not loop all night). Any
        recorded progress starts the count again, so a long outage that ends costs nothing."""
        with self.database.transaction() as conn:
            job = self._held(conn, job_id, attempt)
            now = self.now(conn)
            reason = redact(reason)[:1000]
            before = job.progress.get("interrupted") or {}
            count = before.get("count", 0) + 1
            since = before.get("since") or now.isoformat()
            waited = (now - datetime.fromisoformat(since)).total_seconds()
            if give_up_after is not None and count > 1 and waited >= give_up_after:
                message = (
                    f"interrupted {count} times in {waited / 60:.0f} min without progress "
                    f"(FACTORY_GIVE_UP_AFTER={give_up_after:.0f} s); last: {reason}"
                    + (f". {advice}" if advice else "")
                )
                detail = {"interruptions": count, "since": since, "fault": kind}
                return self._fail_held(conn, job, now, "NoProgress", message, detail)
            progress = {
                **job.progress,
                "interrupted": {
                    "stage": job.stage.value,
                    "reason": reason,
                    "kind": kind,
                    "at": now.isoformat(),
                    "since": since,
                    "count": count,
                },
            }
            self._fenced_update(
                conn, job_id, attempt,
                {"claimed_by": None, "heartbeat_at": None, "updated_at": now,
                 "progress": progress},
                expected_stage=job.stage,
            )  # fmt: skip
            self._event(conn, job_id, job.stage, "interrupted", attempt, job.trace_id,
                        {"reason": reason, "kind": kind, "worker": job.claimed_by,
                         "count": count}, at=now)  # fmt: skip
            return self._read(conn, job_id)

    def note(self, job_id: str, event: str, detail: dict[str, Any]) -> None:
        """An entry on the job's timeline that changes nothing else (a dropped stale message)."""
        with self.database.transaction() as conn:
            job = self._read(conn, job_id)
            self._event(conn, job_id, job.stage, event, job.attempt, job.trace_id, detail)

    def claim_stale(
        self,
        *,
        stale_after: float,
        waiting: Callable[[], Iterable[WaitingMessage]],
        max_recoveries: int,
        worker: str,
        limit: int = 100,
    ) -> tuple[list[Job], list[Job]]:
        """The sweeper's claim: active jobs without a heartbeat for ``stale_after`` seconds.

        A job whose next step waits in a broker queue is left alone: ``waiting()`` lists the
        (job, stage, attempt) of every waiting message, read only when some job is stale,
        and only a message for the job's own stage and current attempt counts (a chunk
        encode, a stale duplicate or a link for a later stage cannot advance it). They are
        excluded in SQL, before the LIMIT, so no backlog of waiting jobs can hide a crashed
        one. ``SELECT … FOR UPDATE SKIP LOCKED`` lets two sweepers run at once: each stale
        job goes to one of them. A job past ``max_recoveries`` automatic recoveries since its
        last progress is failed. Returns (claimed, failed); a claimed job's ``attempt`` is
        the dispatch token.
        """
        last_sign = func.coalesce(jobs.c.heartbeat_at, jobs.c.updated_at)
        active = jobs.c.stage.in_([s.value for s in ACTIVE])
        claimed, failed = [], []
        with self.database.transaction() as conn:
            now = self.now(conn)
            cutoff = now - timedelta(seconds=stale_after)
            stale = select(jobs.c.job_id).where(active, last_sign < cutoff).limit(1)
            if conn.execute(stale).first() is None:
                return [], []
            advancing = set()
            for job_id, stage, attempt in waiting():
                advancing.add((job_id, stage, attempt))
                if stage == Stage.GENERATE.value:  # a segment message also starts a queued job
                    advancing.add((job_id, Stage.QUEUED.value, attempt))
            query = (
                select(jobs)
                .where(active, last_sign < cutoff)
                .order_by(jobs.c.created_at, jobs.c.job_id)
                .limit(limit)
                .with_for_update(skip_locked=True)
            )
            if advancing:
                query = query.where(
                    ~tuple_(jobs.c.job_id, jobs.c.stage, jobs.c.attempt).in_(sorted(advancing))
                )
            rows = conn.execute(query).all()
            for row in rows:
                job = Job.from_row(row)
                quiet = round((now - (job.heartbeat_at or job.updated_at)).total_seconds())
                crashed = job.claimed_by is not None  # released or interrupted jobs did not
                if crashed and job.recoveries >= max_recoveries:
                    failed.append(self._fail_stale(conn, job, now, quiet, max_recoveries))
                    continue
                recoveries = job.recoveries + (1 if crashed else 0)
                conn.execute(
                    update(jobs)
                    .where(jobs.c.job_id == job.job_id, jobs.c.attempt == job.attempt)
                    .values(attempt=job.attempt + 1, recoveries=recoveries,
                            claimed_by=worker, heartbeat_at=now, updated_at=now)
                )  # fmt: skip
                self._event(conn, job.job_id, job.stage, "recovered", job.attempt + 1,
                            job.trace_id, {"silent_seconds": quiet, "worker": job.claimed_by,
                                           "recovery": recoveries}, at=now)  # fmt: skip
                claimed.append(self._read(conn, job.job_id))
        return claimed, failed

    def _fail_stale(self, conn: Connection, job: Job, now: datetime, quiet: int, limit: int) -> Job:
        message = (f"no heartbeat for {quiet} s after {limit} automatic recoveries; "
                   f"last worker {job.claimed_by or 'none'}")  # fmt: skip
        error = {"stage": job.stage.value, "kind": "Abandoned", "message": message,
                 "at": now.isoformat(), "attempt": job.attempt}  # fmt: skip
        conn.execute(
            update(jobs)
            .where(jobs.c.job_id == job.job_id, jobs.c.attempt == job.attempt)
            .values(stage=Stage.FAILED.value, stopped_stage=job.stage.value, last_error=error,
                    attempt=job.attempt + 1, updated_at=now)
        )  # fmt: skip
        self._event(conn, job.job_id, Stage.FAILED, "failed", job.attempt + 1, job.trace_id,
                    {"from": job.stage.value, "kind": "Abandoned", "message": message})  # fmt: skip
        return self._read(conn, job.job_id)

    # --- delivery: versions (factory/pipeline/deliver.py) ------------------------------

    def reserve_version(
        self, job_id: str, *, attempt: int, prefix_for: Callable[[int], str]
    ) -> VersionRecord:
        """The version the deliver stage of ``attempt`` writes, under the job's row lock: a
        number above every published one, with its own store prefix. The same attempt asking
        again gets its own reservation back; a number an earlier attempt reserved and never
        published (its delivery died or was fenced out) is taken over, so an interrupted first
        delivery still lands at the job's own prefix (DESIGN.md's keys); the taker writes and
        verifies every file of it again before publishing it."""
        with self.database.transaction() as conn:
            job = self._held(conn, job_id, attempt)
            if job.stage is not Stage.DELIVER:
                raise self._fenced(conn, job_id, attempt)
            pending = self._unpublished(conn, job)
            if pending is not None and pending.attempt == attempt:
                return VersionRecord.from_row(pending)
            version = self._next_version(conn, job)
            redo = job.progress.get("redo")
            if redo:
                detail: dict[str, Any] = {
                    "kind": "redo", "range": [redo["start"], redo["end"]],
                    "segments": redo["segments"], "join": redo.get("join"),
                    "chunks": redo["chunks"], "reason": redo.get("reason", ""),
                    **({"before": redo["before"]} if "before" in redo else {}),
                }  # fmt: skip
                actor = redo.get("actor", "")
            else:
                detail = {"kind": "first" if job.version is None else "redelivery"}
                actor = ""
            if review := job.progress.get("review"):
                detail["review"] = review
            made = conn.execute(
                select(job_segments.c.segment, job_segments.c.attempt).where(
                    job_segments.c.job_id == job_id
                )
            )
            values = {
                "job_id": job_id, "version": version, "attempt": attempt, "state": "pending",
                "prefix": prefix_for(version), "outputs": None, "detail": detail,
                "segments_from": {str(row.segment): row.attempt for row in made},
                "actor": actor, "reserved_at": self.now(conn), "delivered_at": None,
            }  # fmt: skip
            if pending is None:
                conn.execute(insert(job_versions).values(**values))
            else:  # the earlier attempt is fenced out: its writes stop at its next check
                conn.execute(
                    update(job_versions)
                    .where(job_versions.c.job_id == job_id, job_versions.c.version == version)
                    .values(**{k: v for k, v in values.items() if k not in ("job_id", "version")})
                )
            self._event(conn, job_id, job.stage, "version.reserved", attempt, job.trace_id,
                        {"version": version, "prefix": values["prefix"],
                         **({"taken_over_from": pending.attempt} if pending else {})})  # fmt: skip
            return VersionRecord(**values)

    def commit_version(
        self, job_id: str, *, attempt: int, version: int, outputs: dict[str, str]
    ) -> Job:
        """Publish a reserved version whose files are all stored and verified: its record
        becomes `delivered`, the job's current version moves to it and the job is `done`, in
        one transaction. A version is never older than the one it replaces."""
        with self.database.transaction() as conn:
            job = self._held(conn, job_id, attempt)
            if job.stage is not Stage.DELIVER:
                raise self._fenced(conn, job_id, attempt)
            if job.version is not None and version <= job.version:
                raise StaleAttempt(job_id, attempt, f"version {job.version} is published already")
            now = self.now(conn)
            taken = conn.execute(
                update(job_versions)
                .where(job_versions.c.job_id == job_id, job_versions.c.version == version,
                       job_versions.c.attempt == attempt, job_versions.c.state == "pending")
                .values(state="delivered", outputs=outputs, delivered_at=now)
            )  # fmt: skip
            if taken.rowcount != 1:
                raise StaleAttempt(job_id, attempt, f"version {version} is not this attempt's")
            redo = job.progress.get("redo")
            progress = _with_timing(job.progress, job.stage, Stage.DONE, now)
            progress.pop("redo", None)  # done: what it was is in its version's record
            values = {"stage": Stage.DONE.value, "progress": progress, "version": version,
                      "updated_at": now, "heartbeat_at": now, "recoveries": 0}  # fmt: skip
            self._fenced_update(conn, job_id, attempt, values, expected_stage=job.stage)
            if redo:
                self._event(conn, job_id, job.stage, "redo.delivered", attempt, job.trace_id,
                            {"version": version})  # fmt: skip
            self._event(conn, job_id, Stage.DONE, "advanced", attempt, job.trace_id,
                        {"from": job.stage.value, "version": version})  # fmt: skip
            return self._read(conn, job_id)

    def next_version(self, job_id: str) -> int:
        """The number the job's next delivery will take (what a redo plan predicts)."""
        with self.database.transaction() as conn:
            return self._next_version(conn, self._read(conn, job_id))

    def _next_version(self, conn: Connection, job: Job) -> int:
        """The number the next delivery takes (`reserve_version`): one an earlier attempt
        reserved and never published, else one more than any number taken before."""
        pending = self._unpublished(conn, job)
        if pending is not None:
            return int(pending.version)
        top = conn.execute(
            select(func.max(job_versions.c.version)).where(job_versions.c.job_id == job.job_id)
        ).scalar()
        return int(top or 0) + 1

    def _unpublished(self, conn: Connection, job: Job) -> Any:
        """The reservation above the published version that no delivery published, if any."""
        return conn.execute(
            select(job_versions)
            .where(job_versions.c.job_id == job.job_id, job_versions.c.state == "pending")
            .where(job_versions.c.version > (job.version or 0))
            .order_by(job_versions.c.version.desc())
        ).first()

    # --- operator actions (fence out whoever holds the job) -------------------------

    def cancel(self, job_id: str, *, reason: str = "", actor: str = "") -> Job:
        """Stop the job. A job running (or stopped in) a redo goes back to `done` at the
        version delivered before the redo instead: the redo is dropped, nothing else."""
        with self.database.transaction() as conn:
            job = self._read(conn, job_id, lock=True)
            if discardable_redo(job) and job.stage not in (Stage.DONE, Stage.CANCELLED):
                return self._discard_redo(conn, job, actor=actor, why=reason, how="cancelled")
            if Action.CANCEL not in job.actions:
                raise InvalidOperation(
                    f"job {job_id} is already {job.stage.value}; there is nothing to cancel",
                    field="job",
                )
            now = self.now(conn)
            conn.execute(
                update(jobs)
                .where(jobs.c.job_id == job_id, jobs.c.attempt == job.attempt)
                .values(
                    stage=Stage.CANCELLED.value,
                    stopped_stage=job.stage.value,
                    attempt=job.attempt + 1,
                    updated_at=now,
                    progress=_with_timing(job.progress, job.stage, Stage.CANCELLED, now),
                )
            )
            self._event(
                conn,
                job_id,
                Stage.CANCELLED,
                "cancelled",
                job.attempt + 1,
                job.trace_id,
                {"from": job.stage.value, "reason": reason, **_by(actor)},
            )
            return self._read(conn, job_id)

    def requeue(self, job_id: str, *, from_stage: Stage | None = None, actor: str = "") -> Job:
        """Put the job back to work.

        Without ``from_stage``: continue where it stopped, keeping all recorded progress
        (a failed generate resumes at its next segment). With it: redo that stage and
        every later one from scratch; the progress of earlier stages is kept.
        """
        with self.database.transaction() as conn:
            job = self._read(conn, job_id, lock=True)
            reached = _reached(job)
            if from_stage is None:
                if job.stage is Stage.DONE:
                    raise InvalidOperation(
                        f"job {job_id} is done; give --from STAGE to redo part of it",
                        field="--from",
                    )
                target, progress = reached, dict(job.progress)
            else:
                if from_stage not in REQUEUE_TARGETS:
                    allowed = ", ".join(s.value for s in REQUEUE_TARGETS)
                    raise InvalidOperation(
                        f"cannot requeue to {from_stage.value}; choose one of {allowed}",
                        field="--from",
                    )
                if order(from_stage) > order(reached):
                    raise InvalidOperation(
                        f"job {job_id} only reached {reached.value}; "
                        f"it cannot restart from {from_stage.value}",
                        field="--from",
                    )
                _refuse_after_gc(job, from_stage)
                target, progress = from_stage, reset_progress(job.progress, from_stage)
                if order(from_stage) <= order(Stage.GENERATE):
                    conn.execute(delete(job_segments).where(job_segments.c.job_id == job_id))
                progress.pop("gc", None)  # after gc only generate gets here: all made anew
                # Everything redone is made anew, never picked up from an earlier run: the
                # stages write under keys of their own attempt, segments are recorded with
                # the attempt that made them, and chunks are named by the epoch and the
                # segment files they were made from (docs/jobs.md).
                progress["epoch"] = job.attempt + 1
            # An operator's requeue is a fresh start for the give-up clock (FACTORY_GIVE_UP_AFTER)
            progress.pop("interrupted", None)
            now = self.now(conn)
            conn.execute(
                update(jobs)
                .where(jobs.c.job_id == job_id, jobs.c.attempt == job.attempt)
                .values(
                    stage=target.value,
                    progress=progress,
                    attempt=job.attempt + 1,
                    stopped_stage=None,
                    last_error=None,
                    claimed_by=None,
                    heartbeat_at=None,
                    recoveries=0,
                    updated_at=now,
                )
            )
            self._event(
                conn,
                job_id,
                target,
                "requeued",
                job.attempt + 1,
                job.trace_id,
                {"from": job.stage.value, "to": target.value, "reset": from_stage is not None,
                 **_by(actor)},
            )  # fmt: skip
            return self._read(conn, job_id)

    # --- redo a time range of a delivered job (factory/redo.py) ---------------------

    def start_redo(
        self, job_id: str, *, plan: dict[str, Any], seed: int | None, prompt: str | None,
        reason: str, actor: str,
    ) -> Job:  # fmt: skip
        """A delivered job goes back to `generate` for the plan's segments only: they leave
        ``progress.segments`` (the generate stage makes exactly those again, each from the
        stored tail before it), the later stages start afresh, and the delivery stays as it
        is until the new version passes QC. Fenced like requeue (attempt + 1)."""
        with self.database.transaction() as conn:
            job = self._read(conn, job_id, lock=True)
            if Action.REDO not in job.actions and job.stage is not Stage.DONE:
                raise InvalidOperation(
                    f"job {job_id} is {job.stage.value}; only a delivered (done) job can be "
                    "redone" + ("; a redo of it is running" if job.progress.get("redo") else ""),
                    field="job",
                )
            if Action.REDO not in job.actions:  # done, but gc took what a redo continues from
                raise InvalidOperation(
                    f"job {job_id}: gc removed the segments and chunks a redo continues from; "
                    "`factory requeue --from generate` makes the whole video again",
                    field="job",
                )
            redone = set(plan["segments"])
            join = plan.get("join")
            rows = conn.execute(
                select(job_segments).where(
                    job_segments.c.job_id == job_id,
                    job_segments.c.segment.in_(sorted(redone | {join} - {None})),
                )
            ).all()
            # The files the version before made these segments from: its encoded chunks are
            # named by them, and a redo copies the GOPs it does not change from those chunks.
            previous = {str(row.segment): row.attempt for row in rows}
            # What a discarded redo (rejected, cancelled) puts back: the records of the segments
            # it replaces and the later stages' progress of the version before it.
            restore = {
                "progress": {k: job.progress[k] for k in _REDO_RESTORES if k in job.progress},
                "segments": [_segment_row(row) for row in rows],
            }
            # The number this redo is expected to be delivered as (the deliver stage takes the
            # next free one under the row lock; this is for the plan and the reviewer).
            plan = {**plan, "version": self._next_version(conn, job)}
            source = None
            if join is not None:
                source = {"index": join, "attempt": previous.get(str(join))}
            now = self.now(conn)
            progress = {k: v for k, v in job.progress.items() if k not in ("encode", "mux", "qc")}
            # The chunks keep the epoch the delivered version's are named by, so the chunks
            # the redo does not touch are that version's files, reused as they are.
            encode = job.progress.get("encode", {})
            joined = "joined" in encode and "epoch" in encode
            epoch = encode["epoch"] if joined else progress.get("epoch", 0)
            progress["encode"] = {"epoch": int(epoch)}
            progress["segments"] = [i for i in job.progress["segments"] if i not in redone]
            progress["frame"] = min(progress.get("frame", 0), plan["changed_start"])
            first, end = min(redone), max(redone) + 1  # a redo's segments are consecutive
            if seed is not None:
                progress["seeds"] = give(progress.get("seeds"), first, end, seed)
            if prompt:
                progress["prompts"] = give(progress.get("prompts"), first, end, prompt)
            progress["redo"] = {
                **plan, "seed": seed, "prompt": prompt, "reason": reason, "actor": actor,
                "join_source": source, "at": now.isoformat(), "from_attempt": job.attempt,
                "previous": previous, "restore": restore,
                # What the version before was made with: making this version again from
                # nothing replays its join from that past (factory/pipeline/lineage.py).
                "before": {k: job.progress.get(k) for k in ("seeds", "prompts", "anchor")},
            }  # fmt: skip
            progress["timings"] = {Stage.GENERATE.value: {"started_at": now.isoformat()}}
            conn.execute(
                update(jobs)
                .where(jobs.c.job_id == job_id, jobs.c.attempt == job.attempt)
                .values(stage=Stage.GENERATE.value, progress=progress, attempt=job.attempt + 1,
                        stopped_stage=None, last_error=None, claimed_by=None, heartbeat_at=None,
                        recoveries=0, updated_at=now)
            )  # fmt: skip
            detail = {
                "range": f"{plan['start']:g}-{plan['end']:g}", "segments": plan["segments"],
                "join": join, "chunks": plan["chunks"], "version": plan["version"],
                "cascade": plan["cascade"], "reason": reason, **_by(actor),
                **({"seed": seed} if seed is not None else {}),
                **({"prompt": prompt} if prompt else {}),
            }  # fmt: skip
            self._event(conn, job_id, Stage.GENERATE, "redo.planned", job.attempt + 1,
                        job.trace_id, detail)  # fmt: skip
            return self._read(conn, job_id)

    # --- review (a batch with `review: required`) -----------------------------------

    def requires_review(self, batch: str) -> bool:
        with self.database.transaction() as conn:
            found = conn.execute(select(batches.c.review).where(batches.c.batch == batch))
            return bool(found.scalar())

    def mark_review_notified(self, batch: str) -> bool:
        """Compare-and-set of `batches.review_notified_at`: True for the one caller that sets
        it; cleared again when a job of the batch is approved or sent back, so the next wait
        is announced too."""
        with self.database.transaction() as conn:
            done = conn.execute(
                update(batches)
                .where(batches.c.batch == batch, batches.c.review_notified_at.is_(None))
                .values(review_notified_at=self.now(conn))
            )
            return done.rowcount == 1

    def approve(
        self,
        job_id: str,
        *,
        actor: str,
        note: str = "",
        attempt: int | None = None,
        version: int | None = None,
    ) -> Job:
        """A job waiting for review goes on to delivery (unclaimed: whoever dispatches it, or
        the sweeper after FACTORY_STALE_AFTER, runs the deliver stage)."""
        return self._decide(job_id, actor=actor, approved=True, text=note, attempt=attempt,
                            version=version)  # fmt: skip

    def reject(
        self,
        job_id: str,
        *,
        actor: str,
        reason: str,
        attempt: int | None = None,
        version: int | None = None,
    ) -> Job:
        """Send a job waiting for review back: `failed` in review, with the reason as its error
        (`factory status` shows it); `requeue --from STAGE` makes it again, plain `requeue`
        puts the same files up for review again."""
        if not reason.strip():
            raise BadInput("say why the video is sent back", field="reason")
        return self._decide(job_id, actor=actor, approved=False, text=reason.strip(),
                            attempt=attempt, version=version)  # fmt: skip

    def review_candidate(self, job_id: str) -> dict[str, int] | None:
        """What a job in review would publish: its attempt and the version it would be
        delivered as (a reviewer's decision names both, and is refused if either moved)."""
        with self.database.transaction() as conn:
            job = self._read(conn, job_id)
            if job.stage is not Stage.REVIEW:
                return None
            return {"attempt": job.attempt, "version": self._next_version(conn, job)}

    def _decide(
        self,
        job_id: str,
        *,
        actor: str,
        approved: bool,
        text: str,
        attempt: int | None = None,
        version: int | None = None,
    ) -> Job:
        verb = "approved" if approved else "rejected"
        with self.database.transaction() as conn:
            job = self._read(conn, job_id, lock=True)
            if (Action.APPROVE if approved else Action.REJECT) not in job.actions:
                raise InvalidOperation(
                    f"job {job_id} is {job.stage.value}, not waiting for review; "
                    f"only a job in review can be {verb}",
                    field="job",
                )
            candidate = self._next_version(conn, job)
            if attempt is not None and attempt != job.attempt:
                what = _what_is_in_review(job, candidate)
                raise InvalidOperation(
                    f"job {job_id} changed since it was reviewed: attempt {attempt} was "
                    f"reviewed, attempt {job.attempt} is in review now ({what}); look at it "
                    "again and decide on what is there",
                    field="attempt",
                )
            if version is not None and version != candidate:
                raise InvalidOperation(
                    f"job {job_id}: version {version} was reviewed, but what is in review would "
                    f"be delivered as version {candidate}; look at it again",
                    field="version",
                )
            if not approved and discardable_redo(job):
                return self._discard_redo(conn, job, actor=actor, why=text, how="rejected")
            now = self.now(conn)
            target = Stage.DELIVER if approved else Stage.FAILED
            decision = {"decision": verb, "by": actor, "at": now.isoformat()}
            decision["note" if approved else "reason"] = text
            progress = {**_with_timing(job.progress, job.stage, target, now), "review": decision}
            values: dict[str, Any] = {
                "stage": target.value,
                "progress": progress,
                "attempt": job.attempt + 1,
                "claimed_by": None,
                "heartbeat_at": None,
                "updated_at": now,
            }
            if not approved:
                values["stopped_stage"] = Stage.REVIEW.value
                values["last_error"] = {
                    "stage": Stage.REVIEW.value,
                    "kind": "Rejected",
                    "message": f"sent back by {actor}: {text}",
                    "at": now.isoformat(),
                    "attempt": job.attempt,
                }
            conn.execute(
                update(jobs)
                .where(jobs.c.job_id == job_id, jobs.c.attempt == job.attempt)
                .values(**values)
            )
            conn.execute(
                update(batches).where(batches.c.batch == job.batch).values(review_notified_at=None)
            )
            detail = {"from": Stage.REVIEW.value, **_by(actor)}
            detail["note" if approved else "reason"] = text
            self._event(conn, job_id, target, verb, job.attempt + 1, job.trace_id, detail)
            return self._read(conn, job_id)

    def _discard_redo(self, conn: Connection, job: Job, *, actor: str, why: str, how: str) -> Job:
        """A redo that will not be delivered (rejected in review, cancelled, or dropped after it
        failed): the job is `done` again at the version it had, with the records of the
        segments and the later stages' progress as that version had them; the redo's seeds
        and prompts go with it. Fences out whoever holds the job (attempt + 1)."""
        redo = job.progress["redo"]
        restore = redo["restore"]
        now = self.now(conn)
        progress = {k: v for k, v in job.progress.items()
                    if k not in (*_REDO_RESTORES, "redo", "interrupted")}  # fmt: skip
        progress |= copy.deepcopy(restore["progress"])
        if (redo.get("before") or {}).get("anchor"):  # a redo of segment 0 moved it
            progress["anchor"] = copy.deepcopy(redo["before"]["anchor"])
        progress["segments"] = list(range(progress.get("segments_total", 0)))
        progress["frame"] = progress.get("frames_total", progress.get("frame", 0))
        for row in restore["segments"]:
            values = {**row, "made_at": _parse_time(row.get("made_at"))}
            conn.execute(
                _insert_for(conn)(job_segments)
                .values(job_id=job.job_id, **values)
                .on_conflict_do_update(index_elements=["job_id", "segment"],
                                       set_={k: v for k, v in values.items() if k != "segment"})
            )  # fmt: skip
        conn.execute(
            update(jobs)
            .where(jobs.c.job_id == job.job_id, jobs.c.attempt == job.attempt)
            .values(stage=Stage.DONE.value, progress=progress, attempt=job.attempt + 1,
                    stopped_stage=None, last_error=None, claimed_by=None, heartbeat_at=None,
                    recoveries=0, updated_at=now)
        )  # fmt: skip
        conn.execute(
            update(batches).where(batches.c.batch == job.batch).values(review_notified_at=None)
        )
        detail = {"from": job.stage.value, "how": how, "reason": why, "version": job.version,
                  "range": f"{redo['start']:g}-{redo['end']:g}", "segments": redo["segments"],
                  **_by(actor)}  # fmt: skip
        if how == "rejected":
            self._event(conn, job.job_id, Stage.DONE, "rejected", job.attempt + 1, job.trace_id,
                        {"from": job.stage.value, "reason": why, **_by(actor)})  # fmt: skip
        self._event(conn, job.job_id, Stage.DONE, "redo.discarded", job.attempt + 1,
                    job.trace_id, detail)  # fmt: skip
        return self._read(conn, job.job_id)

    # --- retention (`factory gc`) ---------------------------------------------------

    def mark_gc(
        self,
        job_id: str,
        *,
        attempt: int,
        gc: dict[str, Any],
        event: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> Job:
        """Record in ``progress.gc`` that the intermediates of a delivered job are being (or
        were) removed, and optionally an event. Only while the job is still ``done`` at
        ``attempt``: a job requeued since gc looked at it raises ``StaleAttempt`` and keeps
        its files. While ``progress.gc`` is set, ``requeue --from`` a stage after generate is
        refused (what it would read is gone); ``--from generate`` drops the mark."""
        with self.database.transaction() as conn:
            job = self._read(conn, job_id, lock=True)
            if job.stage is not Stage.DONE or job.attempt != attempt:
                now_at = f"{job.stage.value} at attempt {job.attempt}"
                raise StaleAttempt(job_id, attempt, f"the job is {now_at} now (requeued)")
            now = self.now(conn)
            progress = {**job.progress, "gc": {**gc, "at": now.isoformat(), "attempt": attempt}}
            self._fenced_update(
                conn, job_id, attempt, {"progress": progress, "updated_at": now},
                expected_stage=Stage.DONE,
            )  # fmt: skip
            if event:
                self._event(conn, job_id, Stage.DONE, event, attempt, job.trace_id, detail or {})
            return self._read(conn, job_id)

    # --- internals ---------------------------------------------------------------

    def _read(self, conn: Connection, job_id: str, *, lock: bool = False) -> Job:
        query = select(jobs).where(jobs.c.job_id == job_id)
        if lock:
            query = query.with_for_update()
        row = conn.execute(query).first()
        if row is None:
            raise NoSuchJob(job_id)
        return Job.from_row(row)

    def _held(self, conn: Connection, job_id: str, attempt: int) -> Job:
        """The job, locked for this transaction, if ``attempt`` still holds it."""
        job = self._read(conn, job_id, lock=True)
        if job.attempt != attempt:
            raise self._fenced(conn, job_id, attempt)
        return job

    def _fenced_update(
        self,
        conn: Connection,
        job_id: str,
        attempt: int,
        values: dict[str, Any],
        *,
        expected_stage: Stage,
    ) -> None:
        result = conn.execute(
            update(jobs)
            .where(jobs.c.job_id == job_id, jobs.c.attempt == attempt)
            .where(jobs.c.stage == expected_stage.value)
            .values(**values)
        )
        if result.rowcount == 0:
            raise self._fenced(conn, job_id, attempt)

    def _fenced(self, conn: Connection, job_id: str, held: int) -> StaleAttempt:
        job = self._read(conn, job_id)
        if job.stage is Stage.CANCELLED:
            reason = "the job was cancelled"
        elif job.stage.is_terminal:
            reason = f"the job is {job.stage.value}"
        elif job.attempt != held:
            holder = f" by {job.claimed_by}" if job.claimed_by else ""
            reason = f"attempt {job.attempt} holds the job now{holder}"
        else:
            reason = f"the job moved to {job.stage.value}"
        return StaleAttempt(job_id, held, reason)

    def _event(
        self,
        conn: Connection,
        job_id: str,
        stage: Stage,
        event: str,
        attempt: int,
        trace_id: str,
        detail: dict[str, Any],
        *,
        at: datetime | None = None,
    ) -> None:
        conn.execute(
            insert(job_events).values(
                job_id=job_id,
                at=at if at is not None else self._now_sql(conn),
                stage=stage.value,
                event=event,
                attempt=attempt,
                detail=redact_value(detail),
                trace_id=trace_id,
            )
        )


# Progress keys a redo replaces and a discarded redo puts back as they were before it.
_REDO_RESTORES = ("encode", "mux", "qc", "review", "seeds", "prompts", "timings")


def _what_is_in_review(job: Job, candidate: int) -> str:
    redo = job.progress.get("redo")
    if redo:
        return f"a redo of {redo['start']:g}-{redo['end']:g} s, to be version {candidate}"
    return f"to be version {candidate}"


def _segment_row(row: Any) -> dict[str, Any]:
    data = {k: v for k, v in row._mapping.items() if k != "job_id"}
    made = data.get("made_at")
    data["made_at"] = made.isoformat() if made is not None else None
    return data


def _parse_time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def _by(actor: str) -> dict[str, str]:
    return {"actor": actor} if actor else {}


def _json_or_none(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


# The two writes of the segment path, each one statement on PostgreSQL (the SQLite path does
# the same in steps). Data-modifying CTEs: the row inserts select from the fenced UPDATE, so
# a stale attempt changes nothing and gets no row back. Recording a segment there is for the
# segment path's own order (the next index: the last range of `segment_ranges` grows by
# one, models.Progress); anything else gets no row either and takes the general path.
_ACTIVE_SQL = ", ".join(f"'{s.value}'" for s in ACTIVE)
_CLAIM = text(
    f"""
    WITH claimed AS (
        UPDATE jobs SET attempt = attempt + 1, claimed_by = :worker,
               heartbeat_at = statement_timestamp(), updated_at = statement_timestamp()
        WHERE job_id = :job_id AND attempt = :seen AND stage IN ({_ACTIVE_SQL})
        RETURNING *
    ), event AS (
        INSERT INTO job_events (job_id, at, stage, event, attempt, detail, trace_id)
        SELECT job_id, updated_at, stage, 'claimed', attempt, CAST(:detail AS jsonb), trace_id
        FROM claimed
    )
    SELECT * FROM claimed
    """
).columns(*jobs.c)
_RECORD_SEGMENT = text(
    """
    WITH done AS (
        UPDATE jobs SET
            progress = jsonb_set(
                (progress - 'interrupted') || CAST(:updates AS jsonb),
                '{segment_ranges}',
                CASE WHEN jsonb_array_length(progress->'segment_ranges') = 0
                    THEN jsonb_build_array(jsonb_build_array(:index, :index + 1))
                    ELSE jsonb_set(progress->'segment_ranges', '{-1,1}', to_jsonb(:index + 1))
                END),
            updated_at = statement_timestamp(), heartbeat_at = statement_timestamp(),
            recoveries = 0
        WHERE job_id = :job_id AND attempt = :attempt AND stage IN ('queued', 'generate')
          AND jsonb_typeof(progress->'segment_ranges') = 'array'
          AND CASE WHEN jsonb_array_length(progress->'segment_ranges') = 0 THEN :index = 0
                   ELSE CAST(progress->'segment_ranges'->-1->>1 AS integer) = :index END
        RETURNING *
    ), segment AS (
        INSERT INTO job_segments (job_id, segment, attempt, seconds, colour, seam, memory,
                                  made_at)
        SELECT job_id, :index, :made_by, :seconds, CAST(:colour AS jsonb),
               CAST(:seam AS jsonb), CAST(:memory AS jsonb), updated_at
        FROM done
        ON CONFLICT (job_id, segment) DO UPDATE SET attempt = EXCLUDED.attempt,
            seconds = EXCLUDED.seconds, colour = EXCLUDED.colour, seam = EXCLUDED.seam,
            memory = EXCLUDED.memory, made_at = EXCLUDED.made_at
    ), event AS (
        INSERT INTO job_events (job_id, at, stage, event, attempt, detail, trace_id)
        SELECT job_id, updated_at, stage, 'segment.done', attempt, CAST(:detail AS jsonb),
               trace_id
        FROM done
    )
    SELECT * FROM done
    """
).columns(*jobs.c)


def _refuse_after_gc(job: Job, start: Stage) -> None:
    """After `factory gc` only generate (or queued) can be redone: every later stage reads
    segments, chunks or work files that gc removed (docs/jobs.md)."""
    gc = job.progress.get("gc")
    if not gc or order(start) <= order(Stage.GENERATE):
        return
    when = datetime.fromisoformat(gc["at"]).astimezone(UTC).strftime("%Y-%m-%d %H:%M")
    segments = job.progress.get("segments_total", 0)
    raise InvalidOperation(
        f"job {job.job_id}: its intermediates (segments, chunks, work files) were removed by "
        f"gc on {when} UTC, and redoing {start.value} needs them; use --from generate, which "
        f"regenerates all {segments} segments and every later stage (the delivery stays "
        "until the new run passes QC)",
        field="--from",
    )


def _reached(job: Job) -> Stage:
    """The furthest pipeline stage the job got to (where a failed or cancelled job stopped)."""
    if job.stage in (Stage.FAILED, Stage.CANCELLED):
        return job.stopped_stage or Stage.QUEUED
    return job.stage


def _with_timing(progress: dict[str, Any], leaving: Stage, entering: Stage, now: datetime) -> dict:
    timings = dict(progress.get("timings", {}))
    left = dict(timings.get(leaving.value, {}))
    if "started_at" in left:
        started = datetime.fromisoformat(left["started_at"])
        left["seconds"] = round((now - started).total_seconds(), 3)
        timings[leaving.value] = left
    if not entering.is_terminal:
        timings[entering.value] = {"started_at": now.isoformat()}
    kept = {k: v for k, v in progress.items() if k != "interrupted"}  # resolved by moving on
    return {**kept, "timings": timings}


def _insert_for(conn: Connection) -> Callable[..., Any]:
    # The dialect's module only when it is used: a SQLite home never loads PostgreSQL's.
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert
