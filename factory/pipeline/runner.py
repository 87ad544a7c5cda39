"""Running jobs in-process (the embedded path, `factory run`): claim, then every stage in turn,
each one step of the stage engine (factory/pipeline/engine.py), which the Celery tasks run
too.

Chunks are encoded in a background thread while segments are generated. Any failure leaves
the job in `failed` with the stage it stopped in and the reason, which `factory status`
shows and `factory requeue` continues from; a cancel (or another worker taking the job)
stops the run at its next checkpoint.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from factory.job import Job
from factory.pipeline import engine
from factory.pipeline.context import StageContext
from factory.pipeline.encode import ChunkEncoder
from factory.stages import Stage


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
    # In-process there is no sweeper to hand an interrupted job to: every fault fails it.
    try:
        with (
            engine.settles(ctx.machine, job_id, job.attempt, what="run") as ending,
            engine.heartbeat(ctx, job),
        ):
            while not (job.stage.is_terminal or job.stage.is_parked):
                if job.stage is Stage.ENCODE:
                    encoder.drain()  # chunks encoded during generation are recorded by now
                    job = ctx.machine.get(job_id)
                job = engine.stage_step(stage_ctx, job)
                if observer:
                    observer.stage_changed(job)
    finally:
        encoder.close()
    if ending.how is not None:
        job = ctx.machine.get(job_id)  # failed, cancelled or taken over
    if observer:
        observer.stage_changed(job)
    return job
