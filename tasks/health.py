"""The worker's health endpoint (factory/infra/health.py), started in the worker's main process
once it is ready: liveness from the broker, readiness from the GPU's memory, which pauses
and resumes the worker's own queues through Celery's remote control (handled by the
worker's own event loop, so nothing touches the consumer from another thread).

The scrape-time reads (jobs by stage, queue depths) go through one pooled database connection
and one Redis client made here once, and are cached (factory/infra/metrics.py)."""

from __future__ import annotations

import logging
from typing import Any

import redis
from celery import signals

from factory.gpu.memory import open_memory_source
from factory.infra.health import Governor, HealthServer, Readiness
from factory.infra.redact import register_secrets

log = logging.getLogger("factory.worker")
_started: dict[str, Any] = {}


@signals.worker_ready.connect
def _start_health(sender: Any = None, **_: Any) -> None:
    if sender is None:
        return
    from tasks import broker
    from tasks.celery_app import app

    settings = app.conf.factory_settings
    health = settings.health
    if health.port is None:
        return
    register_secrets([health.metrics_token])
    hostname = sender.hostname
    queues = [queue.name for queue in sender.task_consumer.queues]
    source = open_memory_source(settings.gpu_memory_source, settings.gpu_index)

    def pause() -> None:
        for queue in queues:
            app.control.cancel_consumer(queue, destination=[hostname], reply=True, timeout=5)

    def resume() -> None:
        for queue in queues:
            app.control.add_consumer(queue, destination=[hostname], reply=True, timeout=5)

    redis_client = broker.client(settings.broker_url or "")  # one pool, for /livez and /metrics

    def alive() -> str | None:
        try:
            redis_client.ping()
        except Exception as error:
            return f"broker unreachable: {error}"
        return None

    from factory.infra.metrics import (
        ClusterCollector,
        add_collector,
        exposition,
        jobs_by_stage,
        metrics_engine,
    )

    readiness = Readiness(source, settings.ready_gpu_memory, pause, resume)
    engine = metrics_engine(settings.database_url)
    add_collector(ClusterCollector(
        jobs_by_stage=lambda: jobs_by_stage(engine),
        queue_depths=lambda: _queue_depths(redis_client, queues),
        gpu_memory=lambda: readiness.last.fraction if readiness.last else None,
        cache=health.metrics_cache,
    ))  # fmt: skip
    governor = Governor(readiness, every=settings.readiness_every).start()
    server = HealthServer(health.port, readiness, alive, exposition, health.host,
                          max_requests=health.max_requests, timeout=health.timeout,
                          metrics_token=health.metrics_token).start()  # fmt: skip
    _started.update(governor=governor, server=server)
    log.info("worker.health", extra={"host": health.host, "port": server.port, "queues": queues,
                                     "memory_source": source.name,
                                     "metrics_auth": health.metrics_token is not None,
                                     })  # fmt: skip


@signals.worker_shutting_down.connect
def _stop_health(**_: Any) -> None:
    if "governor" in _started:
        _started.pop("governor").stop()


def _queue_depths(conn: redis.Redis, queues: list[str]) -> dict[str, int]:
    from tasks.queues import CPU, GPU_SHARED

    return {queue: int(conn.llen(queue)) for queue in dict.fromkeys([*queues, GPU_SHARED, CPU])}
