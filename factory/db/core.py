"""What every role of the job state machine stands on (factory/db/state.py composes them):
the database's clock, reading a job, the fence (a write that names an attempt no longer
the job's changes nothing), the timeline, the numbering of versions, and the helpers the
roles share. Names with a leading underscore are factory/db/'s own.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, insert, select, update

from factory.db.models import job_events, job_versions, jobs, utcnow
from factory.db.session import Database
from factory.errors import NoSuchJob, StaleAttempt
from factory.infra.redact import redact_value
from factory.job import Job
from factory.stages import Stage

Clock = Callable[[], datetime]


class MachineCore:
    """Writes take their timestamps from the database's clock (PostgreSQL's
    ``clock_timestamp()``), not the writer's: heartbeats written on one node are compared with
    the sweeper's threshold on another, and a node whose clock is off by minutes must neither
    look dead nor keep a dead job looking alive. SQLite (embedded: one machine) uses the local
    clock. Tests may pass a ``clock`` to drive time themselves."""

    def __init__(self, database: Database, clock: Clock | None = None) -> None:
        self.database = database
        self.clock = clock
        self._settled_listeners: list[Callable[[Job], None]] = []

    def on_settled(self, listener: Callable[[Job], None]) -> None:
        """Call `listener` with the job, once committed, each time a write of this machine
        moves a job to done, failed or cancelled, or parks it in review (the alerts: a
        failure, a batch complete, a batch waiting for review). Whoever made the move
        (a worker, the sweeper, an operator) does not have to remember it."""
        self._settled_listeners.append(listener)

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

    # --- internals --------------------------------------------------------------------

    def _settled(self, conn: Connection, job: Job) -> Job:
        """`job` as this transaction leaves it; if that is terminal or parked, the listeners
        hear of it after the commit."""
        if self._settled_listeners and (job.stage.is_terminal or job.stage.is_parked):
            for listener in self._settled_listeners:
                self.database.after_commit(conn, lambda listener=listener: listener(job))
        return job

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

    # --- version numbers (delivery, a redo's plan, review) ----------------------------

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


def _by(actor: str) -> dict[str, str]:
    return {"actor": actor} if actor else {}


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
