"""Running jobs in-process (the embedded path, `factory run`): claim, then every stage in turn.

Chunks are encoded in a background thread while segments are generated. Any failure leaves
the job in `failed` with the stage it stopped in and the reason, which `factory status`
shows and `factory requeue` continues from; a cancel (or another worker taking the job)
stops the run at its next checkpoint.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

from factory.errors import FactoryError, MediaError, StaleAttempt
from factory.infra.heartbeat import Heartbeat
from factory.job import Job
from factory.pipeline.context import StageContext
from factory.pipeline.deliver import run_deliver
from factory.pipeline.encode import ChunkEncoder, run_encode
from factory.pipeline.generate import run_generate
from factory.pipeline.mux import run_mux
from factory.pipeline.qc import run_qc
from factory.stages import Stage

StageFunction = Callable[[StageContext, Job], Job]

STAGE_FUNCTIONS: dict[Stage, StageFunction] = {
    Stage.QUEUED: run_generate,
    Stage.GENERATE: run_generate,
    Stage.ENCODE: run_encode,
    Stage.MUX: run_mux,
    Stage.QC: run_qc,
    Stage.DELIVER: run_deliver,
}


class Observer(Protocol):
    def segment_done(self, job: Job, index: int) -> None: ...

    def stage_changed(self, job: Job) -> None: ...


def run_job(
    ctx: StageContext, job_id: str, *, worker: str, observer: Observer | None = None
) -> Job:
    job = ctx.machine.get(job_id)
    if job.stage.is_terminal or job.stage.is_parked:
        return job
    job = ctx.machine.claim(job_id, seen_attempt=job.attempt, worker=worker)
    encoder = ChunkEncoder(ctx)

    def on_segment(done: Job, index: int) -> None:
        encoder.segment_ready(done, index)
        if observer:
            observer.segment_done(done, index)

    stage_ctx = dataclasses.replace(ctx, on_segment=on_segment)
    # The heartbeat keeps the job this process's against a sweeper sharing the database, and
    # stops the run at once if the job is taken away (cancelled, requeued, recovered).
    beat = Heartbeat(ctx.machine, job_id, job.attempt, ctx.heartbeat_every,
                     stale_after=ctx.stale_after)  # fmt: skip
    try:
        with beat:
            while not (job.stage.is_terminal or job.stage.is_parked):
                if job.stage is Stage.ENCODE:
                    encoder.drain()  # chunks encoded during generation are recorded by now
                    job = ctx.machine.get(job_id)
                job = STAGE_FUNCTIONS[job.stage](stage_ctx, job)
                if observer:
                    observer.stage_changed(job)
    except StaleAttempt:
        job = ctx.machine.get(job_id)  # cancelled, or taken over: stop without writing
    except FactoryError as exc:
        job = _fail(ctx, job_id, job.attempt, exc)
    except Exception as exc:
        job = _fail(ctx, job_id, job.attempt, exc, kind="InternalError")
    finally:
        encoder.close()
    if observer:
        observer.stage_changed(job)
    return job


def _fail(ctx: StageContext, job_id: str, attempt: int, exc: Exception, kind: str = "") -> Job:
    detail = {}
    if isinstance(exc, MediaError):
        detail = {"command": " ".join(exc.argv)[:2000], "returncode": exc.returncode}
    message = f"{type(exc).__name__}: {exc}" if kind else str(exc)
    try:
        return ctx.machine.fail(
            job_id,
            attempt=attempt,
            kind=kind or type(exc).__name__,
            message=message[:4000],
            detail=detail,
        )
    except StaleAttempt:
        return ctx.machine.get(job_id)
