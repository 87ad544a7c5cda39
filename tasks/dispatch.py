"""Sending work: a job goes out from its recorded stage, with its job id and trace id in the
message headers (they follow it into every log line and event)."""

from __future__ import annotations

from collections.abc import Callable

from celery import Celery, chain

from factory.config import Settings
from factory.job import Job
from factory.stages import Stage
from tasks.queues import CPU, GPU_SHARED

CPU_STAGES = (Stage.ENCODE, Stage.MUX, Stage.QC, Stage.DELIVER)


def headers(job: Job) -> dict[str, str]:
    return {"job_id": job.job_id, "trace_id": job.trace_id}


def send_segment(app: Celery, job: Job, queue: str = GPU_SHARED) -> None:
    app.send_task(
        "factory.generate_segment",
        args=[job.job_id, job.attempt],
        queue=queue,
        headers=headers(job),
    )


def send_shot(app: Celery, job: Job, shot: int | None = None, queue: str = GPU_SHARED) -> None:
    """One more GPU for a video told in shots: joins under the job's current attempt and
    takes an open shot (`shot` first: a holder's own continuation)."""
    app.send_task(
        "factory.generate_shot",
        args=[job.job_id, job.attempt, shot],
        queue=queue,
        headers=headers(job),
    )


def send_cpu_chain(app: Celery, job: Job) -> None:
    """encode → mux → qc → deliver from the job's stage on; each link records its stage.

    Each link carries its fencing token: the attempt it will claim. The first link claims the
    job's current attempt, and each claim adds one, so link i expects ``attempt + i``; any
    other claim in between (an operator, the sweeper) makes the rest of the chain stale,
    and a stale link is dropped instead of taking the job from its holder."""
    remaining = CPU_STAGES[CPU_STAGES.index(job.stage) :]
    links = [
        app.signature(
            "factory.cpu_stage",
            args=[job.job_id, stage.value, job.attempt + i],
            immutable=True,
            queue=CPU,
            headers=headers(job),
        )
        for i, stage in enumerate(remaining)
    ]
    chain(*links).apply_async(headers=headers(job))


def send_chunk(app: Celery, job: Job, chunk: int) -> None:
    app.send_task("factory.encode_chunk", args=[job.job_id, chunk], queue=CPU, headers=headers(job))


def dispatch(app: Celery, job: Job) -> None:
    """Send a job from where it stands: generation to the GPUs, later stages to the CPUs."""
    if job.stage in (Stage.QUEUED, Stage.GENERATE):
        send_segment(app, job)
    elif job.stage in CPU_STAGES:
        send_cpu_chain(app, job)


class BrokerDispatcher:
    """The Operations dispatcher of every process that has a broker (the CLI, `factory
    serve`, the benches): each job goes to the workers from its recorded stage, through a
    Celery app built from the settings given (not from this process's environment). A broker
    that is away is not the operator's failure: the action is recorded, `on_outage` says so,
    and the sweeper sends the jobs within FACTORY_STALE_AFTER of the broker's return."""

    def __init__(
        self, settings: Settings, on_outage: Callable[[list[Job], Exception], None]
    ) -> None:
        self._settings = settings
        self._on_outage = on_outage
        self._app: Celery | None = None

    def __call__(self, found: list[Job]) -> None:
        if self._app is None:
            from tasks.celery_app import make_app

            self._app = make_app(self._settings)
        try:
            for job in found:
                dispatch(self._app, job)
        except Exception as exc:  # kombu's errors have no common base with the socket's
            self._on_outage(found, exc)
