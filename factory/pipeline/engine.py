"""The stage engine: how a held job's work runs and how it ends, written once. The embedded
runner (factory/pipeline/runner.py) calls it in a loop; a Celery task (tasks/jobs.py) is a
message in, one engine step, the next message out. What the lifecycle tests prove on the
embedded path is then what production runs.

- `stage_step`: one stage of a held job, from the one stage table;
- `heartbeat`: the beat that keeps a held job alive and stops the work once it is taken away;
- `settles`: how work that does not finish ends: fenced out (stop, write nothing), interrupted
  (the transport's policy: the job handed back for the sweeper), or failed with the whole
  error record (`failure_of`: an ffmpeg failure keeps its command and return code);
- `shot_lease` and `shots_to_offer`: the lease of each shot of a video told in shots, and
  which shots the sweeper offers to idle GPUs (no one holds them, no waiting message will
  take them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from factory.db.state import JobStateMachine
from factory.errors import FactoryError, MediaError, StaleAttempt
from factory.infra.heartbeat import Heartbeat
from factory.job import Job
from factory.pipeline.claims import Claims
from factory.pipeline.context import StageContext
from factory.pipeline.deliver import run_deliver
from factory.pipeline.encode import run_encode
from factory.pipeline.generate import run_generate
from factory.pipeline.mux import run_mux
from factory.pipeline.qc import run_qc
from factory.plan.video import open_shots, video_shots
from factory.stages import Stage

log = logging.getLogger("factory.engine")

StageFunction = Callable[[StageContext, Job], Job]

STAGE_FUNCTIONS: dict[Stage, StageFunction] = {
    Stage.QUEUED: run_generate,
    Stage.GENERATE: run_generate,
    Stage.ENCODE: run_encode,
    Stage.MUX: run_mux,
    Stage.QC: run_qc,
    Stage.DELIVER: run_deliver,
}
CPU_STAGES = (Stage.ENCODE, Stage.MUX, Stage.QC, Stage.DELIVER)
SWEEPER = " (sweeper)"  # how a job the sweeper claimed names its holder


def stage_step(ctx: StageContext, job: Job, claims: Claims | None = None) -> Job:
    """The job's current stage, run to its end by the holder of ``job.attempt``. ``claims``:
    where chunk claims live (Redis across workers; the process's own by default)."""
    if job.stage is Stage.ENCODE:
        return run_encode(ctx, job, claims=claims)
    return STAGE_FUNCTIONS[job.stage](ctx, job)


def heartbeat(ctx: StageContext, job: Job) -> Heartbeat:
    """The beat of the holder of ``job.attempt`` (FACTORY_HEARTBEAT_EVERY, stopping the work
    before FACTORY_STALE_AFTER could give the job to another)."""
    return Heartbeat(ctx.machine, job.job_id, job.attempt, ctx.heartbeat_every,
                     stale_after=ctx.stale_after)  # fmt: skip


@dataclass(frozen=True)
class Failure:
    """What a failed job records (`last_error`, the `failed` event): the kind, the message,
    and for an ffmpeg failure the command and its return code."""

    kind: str
    message: str
    detail: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, exc: BaseException, *, internal: bool = False) -> Failure:
        detail: dict[str, Any] = {}
        if isinstance(exc, MediaError):
            detail = {"command": " ".join(exc.argv)[:2000], "returncode": exc.returncode}
        kind = "InternalError" if internal else type(exc).__name__
        message = f"{type(exc).__name__}: {exc}" if internal else str(exc)
        return cls(kind, message[:4000], detail)


def record_failure(
    machine: JobStateMachine, job_id: str, attempt: int, exc: BaseException, *,
    internal: bool = False,
) -> Job:  # fmt: skip
    """The job `failed` with ``exc``'s record, if ``attempt`` still holds it; the job as it
    is either way."""
    failure = Failure.of(exc, internal=internal)
    log.error("job.failed", extra={"job_id": job_id, "kind": failure.kind,
                                   "error": failure.message})  # fmt: skip
    try:
        return machine.fail(job_id, attempt=attempt, kind=failure.kind,
                            message=failure.message, detail=failure.detail)  # fmt: skip
    except StaleAttempt:
        return machine.get(job_id)


@dataclass
class Ending:
    """How the work inside `settles` ended: None while it finished; else "stopped" (fenced
    out), "interrupted" or "failed"."""

    how: str | None = None


@contextmanager
def settles(
    machine: JobStateMachine,
    job_id: str,
    attempt: int,
    *,
    what: str,
    interruptions: tuple[type[BaseException], ...] = (),
    interrupt: Callable[[BaseException], None] | None = None,
    reraise_internal: bool = False,
) -> Iterator[Ending]:
    """How a holder's work ends when it does not finish: fenced out (nothing to record: the
    job is someone else's now), interrupted by one of the transport's ``interruptions`` (its
    ``interrupt`` hands the job back for the sweeper), or failed with its whole record (an
    unexpected exception as `InternalError`, re-raised when the transport wants to see it)."""
    ending = Ending()
    try:
        yield ending
    except StaleAttempt as exc:
        ending.how = "stopped"
        log.info(f"{what}.stopped", extra={"job_id": job_id, "reason": exc.reason})
    except interruptions as exc:
        ending.how = "interrupted"
        log.warning(f"{what}.interrupted", extra={"job_id": job_id, "error": str(exc)})
        if interrupt is not None:
            interrupt(exc)
    except FactoryError as exc:
        ending.how = "failed"
        record_failure(machine, job_id, attempt, exc)
    except Exception as exc:
        ending.how = "failed"
        record_failure(machine, job_id, attempt, exc, internal=True)
        if reraise_internal:
            raise


def shot_lease(job: Job, shot: int) -> str:
    """The lease key of shot ``shot`` of the job's current attempt."""
    return f"shot/{job.job_id}/{job.attempt}/{shot}"


def shots_to_offer(
    machine: JobStateMachine,
    claims: Claims,
    waiting: Callable[[], dict[tuple[str, int], list[int | None]]],
    *,
    recovered: set[str],
    lease_seconds: float,
    sweep_seconds: float,
) -> list[tuple[Job, int]]:
    """The shots of videos in generation that no one holds and no waiting message will take,
    while the job itself is held (a holder died mid-shot, or froze past its lease, while the
    others work on): each at most once per lease lifetime, so an idle GPU resumes it within
    two sweeps of its lease's expiry instead of once the job has gone quiet. A job the
    sweeper itself holds (``recovered``, its message on the way) is left to that message,
    which takes its shots under the attempt it claims. ``waiting``: the shots that messages
    in the queue name, by (job, attempt); a message naming none takes any open shot.

    A taker between its message and its lease (the message gone from the queue, the lease
    not yet in Redis) looks just like a shot no one will take, so a shot is offered only
    when the sweep before (``sweep_seconds`` apart) saw it unheld too."""
    offered: list[tuple[Job, int]] = []
    asked_for: dict[tuple[str, int], list[int | None]] | None = None
    for job in machine.list_jobs(stage=Stage.GENERATE):
        if job.claimed_by is None or len(video_shots(job.video)) < 2:
            continue
        if job.job_id in recovered or job.claimed_by.endswith(SWEEPER):
            continue
        unheld = [s for s in open_shots(job) if not claims.held(shot_lease(job, s))]
        if not unheld:
            continue
        if asked_for is None:
            asked_for = waiting()
        asked = asked_for.get((job.job_id, job.attempt), [])
        # Each waiting message takes one open shot when a GPU gets to it: the one it names
        # first, else any. Only the shots beyond those are offered.
        spare = [s for s in unheld if s not in asked][: max(0, len(unheld) - len(asked))]
        for shot in spare:
            lease = shot_lease(job, shot)
            if claims.once(f"unheld/{lease}", 3 * sweep_seconds):
                continue  # first seen unheld: its taker may be on its way
            if claims.once(f"offered/{lease}", lease_seconds):
                offered.append((job, shot))
    return offered
