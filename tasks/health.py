"""The worker's health endpoint (factory/health.py), started in the worker's main process
once it is ready: liveness from the broker, readiness from the GPU's memory, which pauses
and resumes the worker's own queues through Celery's remote control (handled by the
worker's own event loop, so nothing touches the consumer from another thread)."""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import signals

from factory.generate.gpu_memory import open_memory_source
from factory.health import Governor, HealthServer, Readiness

log = logging.getLogger("factory.worker")
_started: dict[str, Any] = {}


@signals.worker_ready.connect
def _start_health(sender: Any = None, **_: Any) -> None:
    port = os.environ.get("FACTORY_HEALTH_PORT")
    if not port or sender is None:
        return
    from tasks import broker
    from tasks.app import app

    settings = app.conf.factory_settings
    hostname = sender.hostname
    queues = [queue.name for queue in sender.task_consumer.queues]
    gpu = os.environ.get("FACTORY_GPU_INDEX")
    source = open_memory_source(settings.gpu_memory_source, int(gpu) if gpu else None)

    def pause() -> None:
        for queue in queues:
            app.control.cancel_consumer(queue, destination=[hostname], reply=True, timeout=5)

    def resume() -> None:
        for queue in queues:
            app.control.add_consumer(queue, destination=[hostname], reply=True, timeout=5)

    def alive() -> str | None:
        try:
            broker.client(settings.broker_url or "").ping()
        except Exception as error:
            return f"broker unreachable: {error}"
        return None

    from factory.metrics import ClusterCollector, add_collector, exposition

    readiness = Readiness(source, settings.ready_gpu_memory, pause, resume)
    add_collector(ClusterCollector(
        jobs_by_stage=lambda: _jobs_by_stage(settings.database_url),
        queue_depths=lambda: _queue_depths(settings.broker_url or "", queues),
        gpu_memory=lambda: readiness.last.fraction if readiness.last else None,
    ))  # fmt: skip
    governor = Governor(readiness, every=settings.readiness_every).start()
    server = HealthServer(int(port), readiness, alive, exposition).start()
    _started.update(governor=governor, server=server)
    log.info("worker.health", extra={"port": server.port, "queues": queues,
                                     "memory_source": source.name})  # fmt: skip


@signals.worker_shutting_down.connect
def _stop_health(**_: Any) -> None:
    if "governor" in _started:
        _started.pop("governor").stop()


def _jobs_by_stage(database_url: str) -> dict[str, int]:
    """Counted at scrape time on a connection that is closed right after: the worker's main
    process forks its children and must not hold a pooled connection across a fork."""
    from sqlalchemy import create_engine, func, select
    from sqlalchemy.pool import NullPool

    from factory.db.models import jobs

    engine = create_engine(database_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(jobs.c.stage, func.count()).group_by(jobs.c.stage)).all()
    finally:
        engine.dispose()
    return {stage: count for stage, count in rows}


def _queue_depths(broker_url: str, queues: list[str]) -> dict[str, int]:
    from tasks import broker
    from tasks.queues import CPU, GPU_SHARED

    conn = broker.client(broker_url)
    return {queue: int(conn.llen(queue)) for queue in dict.fromkeys([*queues, GPU_SHARED, CPU])}
