"""What operators do to jobs: create them (`factory submit`), cancel, requeue, approve and
reject. Each takes the job's row lock and, where it changes the stage, fences out whoever
holds the job (attempt + 1), which is how a running worker learns at its next checkpoint
or heartbeat that it must stop. A redo of a delivered job is in operator_redo.py.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, delete, select, update

from factory.db.core import _by, _insert_for, _with_timing
from factory.db.models import batches, job_segments, jobs
from factory.db.operator_redo import RedoActions, _segment_row
from factory.errors import BadInput, InvalidOperation
from factory.job import Job, discardable_redo
from factory.plan.video import video_plan
from factory.spec import VideoSpec
from factory.stages import REQUEUE_TARGETS, Action, Stage, initial_progress, order, reset_progress


@dataclass(frozen=True)
class Created:
    job: Job
    created: bool  # False: the same spec was already there


class OperatorActions(RedoActions):
    """Submitting, cancelling, requeueing and reviewing jobs."""

    # --- creating ---------------------------------------------------------------------

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
            segments = len(video_plan(video))
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

    # --- operator actions (fence out whoever holds the job) ---------------------------

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
            return self._settled(conn, self._read(conn, job_id))

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
                remakes = order(from_stage) <= order(Stage.GENERATE)
                if discardable_redo(job):
                    # A redo pending: what a later discard puts back must survive the reset.
                    progress["redo"] = self._keep_for_discard(conn, job, progress, remakes)
                if remakes:
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
            return self._settled(conn, self._read(conn, job_id))  # --from review parks it

    def _keep_for_discard(
        self, conn: Connection, job: Job, reset: dict[str, Any], remakes: bool
    ) -> dict[str, Any]:
        """The pending redo's record with everything a requeue of it is about to drop and a
        discard must put back (the version before the redo): the records of the segments the
        redo did not replace (a remake deletes every row), and the progress keys the reset
        changes that the redo's restore does not hold yet."""
        redo = copy.deepcopy(job.progress["redo"])
        restore = redo["restore"]
        if remakes:
            kept = {row["segment"] for row in restore["segments"]}
            rows = conn.execute(select(job_segments).where(job_segments.c.job_id == job.job_id))
            restore["segments"] += [_segment_row(row) for row in rows
                                    if row.segment not in kept]  # fmt: skip
        saved, absent = restore["progress"], restore.setdefault("absent", [])
        for key in sorted(set(job.progress) | set(reset)):
            if key in _NOT_RESTORED or key in saved or key in absent:
                continue
            if key not in job.progress:
                absent.append(key)
            elif reset.get(key) != job.progress[key]:
                saved[key] = copy.deepcopy(job.progress[key])
        return redo

    # --- review (a batch with `review: required`) -------------------------------------

    def decide(
        self,
        job_id: str,
        *,
        actor: str,
        approved: bool,
        text: str,
        attempt: int | None = None,
        version: int | None = None,
    ) -> Job:
        """A reviewer's decision on a job waiting for review. Approved: it goes on to delivery
        (unclaimed: whoever dispatches it, or the sweeper after FACTORY_STALE_AFTER, runs the
        deliver stage); `text` is the note. Rejected: `failed` in review with `text`, the
        reason, as its error (`factory status` shows it); `requeue --from STAGE` makes it
        again, plain `requeue` puts the same files up for review again."""
        if not approved:
            text = text.strip()
            if not text:
                raise BadInput("say why the video is sent back", field="reason")
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
            return self._settled(conn, self._read(conn, job_id))


# Progress a discard sets itself (segments, frame) or that is the redo's own.
_NOT_RESTORED = ("segments", "frame", "redo", "timings", "interrupted", "frames_total",
                 "segments_total", "segment_ranges", "holders")  # fmt: skip


def _what_is_in_review(job: Job, candidate: int) -> str:
    redo = job.progress.get("redo")
    if redo:
        return f"a redo of {redo['start']:g}-{redo['end']:g} s, to be version {candidate}"
    return f"to be version {candidate}"


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
