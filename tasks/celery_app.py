"""The Celery app, configured from settings (FACTORY_BROKER_URL and friends).

Recovery belongs to PostgreSQL, not the broker (see shared reference CELERY_NOTES): tasks
are acknowledged early, prefetch is off, a lost worker's task is not redelivered, and the
sweeper re-dispatches stale jobs from their recorded stage and segment. The visibility
timeout is longer than any task so Redis never re-delivers a running one.
"""

from __future__ import annotations

from celery import Celery
from kombu import Queue

from factory.config import Settings
from tasks.queues import CONTROL, CPU, GPU_SHARED

TWELVE_HOURS = 12 * 3600


def make_app(settings: Settings) -> Celery:
    app = Celery("factory", broker=settings.broker_url or "memory://", include=["tasks.jobs"])
    app.conf.update(
        task_ignore_result=True,
        task_acks_late=False,
        task_reject_on_worker_lost=False,
        worker_prefetch_multiplier=1,
        worker_disable_prefetch=True,
        worker_proc_alive_timeout=600,  # a model load in worker_process_init takes minutes
        worker_max_tasks_per_child=500,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        # A GPU worker consumes its own queue, then the shared one (`-Q gpu.<host>.<n>,gpu`):
        # in that order, strictly. Kombu's default rotates the order after every message, so
        # a worker would take a new job between two segments of the one it holds.
        broker_transport_options={
            "visibility_timeout": TWELVE_HOURS,
            "queue_order_strategy": "priority",
        },
        task_default_queue=CPU,
        task_queues=[Queue(GPU_SHARED), Queue(CPU), Queue(CONTROL)],
        task_routes={
            "factory.generate_segment": {"queue": GPU_SHARED},
            "factory.generate_shot": {"queue": GPU_SHARED},
            "factory.sweep": {"queue": CONTROL},
        },
        beat_schedule={
            "sweep": {
                "task": "factory.sweep",
                "schedule": float(settings.sweep_every),
                # A sweep not started within its period is dropped: the next one replaces it.
                "options": {"queue": CONTROL, "expires": float(settings.sweep_every)},
            },
        },
        task_soft_time_limit=settings.segment_time_limit,
        task_time_limit=settings.segment_time_limit + 60,
    )
    app.conf.factory_settings = settings
    return app


app = make_app(Settings.from_env())
