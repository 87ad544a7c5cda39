"""The factory's own upkeep: the sweeper's claim of jobs that went quiet (and its giving up on
them), `factory gc`'s mark on a delivered job whose intermediates it removes, and the
compare-and-set marks that make a batch's alerts go out once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Column, Connection, func, select, tuple_, update

from factory.db.core import MachineCore
from factory.db.models import batches, jobs
from factory.errors import StaleAttempt
from factory.job import Job
from factory.stages import ACTIVE, Stage

# (job_id, stage, attempt) of a message waiting in the broker that would advance that job
WaitingMessage = tuple[str, str, int]


class Upkeep(MachineCore):
    """The sweeper, `factory gc` and the alerts' once-only marks."""

    # --- the sweeper ------------------------------------------------------------------

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
        return self._settled(conn, self._read(conn, job.job_id))

    # --- retention (`factory gc`) -----------------------------------------------------

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

    # --- alerts: each announced once (factory/infra/alerts.py) ------------------------

    def mark_batch_notified(self, batch: str) -> bool:
        """Compare-and-set of `batches.notified_at`: True for the one caller that sets it."""
        return self._first_to_mark(batch, batches.c.notified_at)

    def mark_review_notified(self, batch: str) -> bool:
        """Compare-and-set of `batches.review_notified_at`: True for the one caller that sets
        it; cleared again when a job of the batch is approved or sent back, so the next wait
        is announced too."""
        return self._first_to_mark(batch, batches.c.review_notified_at)

    def _first_to_mark(self, batch: str, column: Column[Any]) -> bool:
        with self.database.transaction() as conn:
            done = conn.execute(
                update(batches)
                .where(batches.c.batch == batch, column.is_(None))
                .values({column.name: self.now(conn)})
            )
            return done.rowcount == 1
