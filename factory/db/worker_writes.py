"""The writes a worker makes while it holds a job: the claim that gives it an attempt (its
fencing token) or a join that shares it (one more GPU on a video's shots), then transition,
checkpoint, record_segment, heartbeat, fail, release and
interrupt, each carrying ``AND attempt = :mine``, so a stale holder changes nothing and gets
``StaleAttempt``; and note, an entry on the timeline that changes nothing else.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text, update

from factory.db.core import MachineCore, _insert_for, _with_timing
from factory.db.models import job_segments, jobs
from factory.errors import IllegalTransition, StaleAttempt
from factory.infra.redact import redact, redact_value
from factory.job import Job, SegmentRecord
from factory.stages import ACTIVE, Stage, is_legal


class WorkerWrites(MachineCore):
    """What a worker writes while it holds a job, each write fenced by its attempt."""

    # --- worker actions (fenced by attempt) -------------------------------------------

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

    def join(self, job_id: str, *, attempt: int, worker: str, shot: int | None = None) -> Job:
        """One more GPU on a job's generation, under the attempt that holds it (no new one:
        its holders share the fencing token, each making other shots; a requeue, cancel or
        recovery fences them all out at once). Refused as stale unless the job is still in
        `generate` at ``attempt``."""
        with self.database.transaction() as conn:
            job = self._held(conn, job_id, attempt)
            if job.stage is not Stage.GENERATE:
                raise StaleAttempt(job_id, attempt, f"the job is in {job.stage.value}")
            detail = {"worker": worker, **({"shot": shot} if shot is not None else {})}
            self._event(conn, job_id, job.stage, "shot.joined", attempt, job.trace_id, detail)
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
            return self._settled(conn, self._read(conn, job_id))

    def checkpoint(
        self,
        job_id: str,
        *,
        attempt: int,
        updates: dict[str, Any],
        event: str | None = None,
        detail: dict[str, Any] | None = None,
        stage: Stage | None = None,
    ) -> Job:
        """Replace top-level progress keys; optionally record an event on the timeline.
        ``stage``: the stage the writer runs; a writer of a stage the job has left (under the
        same attempt) changes nothing (workers always give it; docs/jobs.md, "Fencing").

        Recording work (non-empty ``updates``) is progress: the counts of recoveries and
        interruptions start again from zero."""
        with self.database.transaction() as conn:
            job = self._held(conn, job_id, attempt)
            if stage is not None and job.stage is not stage:
                raise self._fenced(conn, job_id, attempt)
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
        shot: int | None = None,
    ) -> Job:
        """A segment made and stored: its row in `job_segments`, its index in
        ``progress.segments`` with ``updates``, and the `segment.done` event, in one fenced
        transaction. The per-segment details live in their own rows, so the cost does not
        grow with the segments already done. Fenced by the attempt and the stage (generate);
        a segment a shot's holder made (``record.holder``) also by that holder still being
        the one `take_shot` recorded for ``shot``."""
        with self.database.transaction() as conn:
            if (
                self.clock is None
                and conn.dialect.name == "postgresql"
                and "segments" not in updates
                and record.holder is None
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
            if job.stage not in _MAKING:  # a holder still writing after the job moved on
                raise self._fenced(conn, job_id, attempt)
            if record.holder is not None:
                _hold_shot(job, shot, record.holder)
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
                .where(jobs.c.stage.in_([s.value for s in _MAKING]))
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
                "holder": record.holder,
            }
            conn.execute(
                _insert_for(conn)(job_segments)
                .values(job_id=job_id, segment=record.index, **values)
                .on_conflict_do_update(index_elements=["job_id", "segment"], set_=values)
            )
            self._event(conn, job_id, job.stage, "segment.done", attempt, job.trace_id, detail,
                        at=now)  # fmt: skip
            return Job.from_row(row)

    def take_shot(self, job_id: str, *, attempt: int, shot: int, holder: str, worker: str) -> Job:
        """``holder`` (a lease's own id) makes shot ``shot`` from now on, recorded under the
        job's row lock: the segments of the shot's holder before it are fenced out
        (`record_segment`), whatever its lease in Redis still says."""
        with self.database.transaction() as conn:
            job = self._held(conn, job_id, attempt)
            if job.stage is not Stage.GENERATE:
                raise self._fenced(conn, job_id, attempt)
            holders = {**job.progress.get("holders", {}), str(shot): holder}
            self._fenced_update(conn, job_id, attempt, {"progress": {**job.progress,
                                "holders": holders}}, expected_stage=Stage.GENERATE)  # fmt: skip
            self._event(conn, job_id, job.stage, "shot.taken", attempt, job.trace_id,
                        {"shot": shot, "worker": worker, "attempt": attempt,
                         "holder": holder})  # fmt: skip
            return self._read(conn, job_id)

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
        return self._settled(conn, self._read(conn, job.job_id))

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


# The stages segments are recorded in (a claimed job is generating from `queued` on).
_MAKING = (Stage.QUEUED, Stage.GENERATE)


def _hold_shot(job: Job, shot: int | None, holder: str) -> None:
    """Refuse a shot holder's write once another holder took the shot (or none did)."""
    now = job.progress.get("holders", {}).get(str(shot))
    if shot is None or now != holder:
        who = "no holder" if now is None else "another holder"
        raise StaleAttempt(job.job_id, job.attempt, f"shot {shot} is held by {who} now")


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
                                  made_at, holder)
        SELECT job_id, :index, :made_by, :seconds, CAST(:colour AS jsonb),
               CAST(:seam AS jsonb), CAST(:memory AS jsonb), updated_at, NULL
        FROM done
        ON CONFLICT (job_id, segment) DO UPDATE SET attempt = EXCLUDED.attempt,
            seconds = EXCLUDED.seconds, colour = EXCLUDED.colour, seam = EXCLUDED.seam,
            memory = EXCLUDED.memory, made_at = EXCLUDED.made_at, holder = NULL
    ), event AS (
        INSERT INTO job_events (job_id, at, stage, event, attempt, detail, trace_id)
        SELECT job_id, updated_at, stage, 'segment.done', attempt, CAST(:detail AS jsonb),
               trace_id
        FROM done
    )
    SELECT * FROM done
    """
).columns(*jobs.c)
