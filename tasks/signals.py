"""Worker life cycle: logging with trace ids, the runtime built after the fork, a GPU
worker's own queue announced while it lives, and handed back to all GPUs when it leaves."""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import signals

from factory.config import Settings
from factory.infra import logs
from factory.spec import ModelChoice
from tasks import broker
from tasks.queues import ALIVE_PREFIX, GPU_SHARED
from tasks.runtime import runtime

log = logging.getLogger("factory.worker")
ALIVE_TTL = 60
_announcer: threading.Event | None = None


@signals.setup_logging.connect
def _logging(**_: Any) -> None:
    from tasks.celery_app import app

    logs.configure(app.conf.factory_settings.log_format)


@signals.task_prerun.connect
def _task_context(task: Any = None, **_: Any) -> None:
    request = task.request if task else None
    job_id = (request.get("job_id") if request else None) or "-"
    trace_id = (request.get("trace_id") if request else None) or "-"
    logs.job_id.set(job_id)
    logs.trace_id.set(trace_id)


@signals.worker_process_init.connect
def _process_init(**_: Any) -> None:
    """Load the models this GPU worker serves once, in the child (never CUDA in the parent)."""
    rt = runtime()
    for spec in rt.settings.preload_models:
        family, _, path = spec.partition(":")
        rt.ctx.generator(ModelChoice(family=family, path=path or None))
    log.info("worker.process_ready", extra={"worker": rt.worker})


@signals.worker_ready.connect
def _announce_own_queue(**_: Any) -> None:
    global _announcer
    queue = _settings().gpu_queue
    url = _broker_url()
    if not queue or not url:
        return
    stop = threading.Event()

    def beat() -> None:
        conn = broker.client(url)
        while True:
            try:
                conn.set(ALIVE_PREFIX + queue, "1", ex=ALIVE_TTL)
            except Exception as exc:  # the broker is away for a moment; try again
                log.warning("worker.announce_failed", extra={"error": str(exc)})
            if stop.wait(ALIVE_TTL / 3):
                return

    _announcer = stop
    threading.Thread(target=beat, name="announce-queue", daemon=True).start()


@signals.worker_shutting_down.connect
def _hand_back(**_: Any) -> None:
    """Stop announcing the own queue (the running segment then goes to the shared queue when
    it ends) and move what waits in the own queue to the shared one now."""
    queue = _settings().gpu_queue
    url = _broker_url()
    if _announcer is not None:
        _announcer.set()
    if not queue or not url:
        return

    conn = broker.client(url)
    conn.delete(ALIVE_PREFIX + queue)
    _move_own_queue(queue, url)


@signals.worker_shutdown.connect
def _hand_back_restored(**_: Any) -> None:
    """Once the consumer has closed: a message this worker had reserved but not started is put
    back (by the Redis transport) into its own queue, which nobody will read any more; move
    it to the shared queue too."""
    queue = _settings().gpu_queue
    url = _broker_url()
    if queue and url:
        _move_own_queue(queue, url)


def _move_own_queue(queue: str, url: str) -> None:
    from tasks.celery_app import app

    conn = broker.client(url)
    for raw, headers in list(broker.messages(conn, queue)):
        if conn.lrem(queue, 1, raw):
            args = broker.message_args(raw)  # a segment's (job, attempt), a shot's + shot
            app.send_task(
                headers.get("task") or "factory.generate_segment",
                args=args,
                queue=GPU_SHARED,
                headers={k: headers[k] for k in ("job_id", "trace_id") if k in headers},
            )
            log.info("worker.handed_back", extra={"job_id": args[0]})


def _settings() -> Settings:
    from tasks.celery_app import app

    return app.conf.factory_settings


def _broker_url() -> str | None:
    return _settings().broker_url
