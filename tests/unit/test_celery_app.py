"""How the Celery app routes the sweeper: its own queue, consumed by `factory beat` itself,
so sweeps never wait behind encodes, and a sweep that could not start in its period expires."""

from __future__ import annotations

from factory.config import Settings


def test_sweeps_have_their_own_queue_and_expire():
    from tasks.celery_app import make_app

    app = make_app(Settings.from_env({"FACTORY_BROKER_URL": "redis://127.0.0.1:1/0",
                                      "FACTORY_SWEEP_EVERY": "30"}))  # fmt: skip
    entry = app.conf.beat_schedule["sweep"]
    assert entry["schedule"] == 30.0
    assert entry["options"] == {"queue": "control", "expires": 30.0}
    assert app.conf.task_routes["factory.sweep"] == {"queue": "control"}
    assert "control" in {q.name for q in app.conf.task_queues}


def test_long_gpu_tasks_are_acked_early_one_at_a_time_and_never_redelivered_while_running():
    """DESIGN.md's settings for long tasks: recovery belongs to PostgreSQL (the sweeper), so a
    task is acknowledged when it starts and not handed back when its worker dies; a worker
    takes one message at a time; Redis's visibility timeout outlasts any task's hard limit, so
    a running task is never delivered a second time."""
    from tasks.celery_app import make_app

    settings = Settings.from_env({"FACTORY_BROKER_URL": "redis://127.0.0.1:1/0",
                                  "FACTORY_SEGMENT_TIME_LIMIT": "1800"})  # fmt: skip
    conf = make_app(settings).conf
    assert conf.task_acks_late is False and conf.task_reject_on_worker_lost is False
    assert conf.worker_prefetch_multiplier == 1 and conf.worker_disable_prefetch is True
    assert conf.broker_transport_options["visibility_timeout"] > conf.task_time_limit
    assert conf.task_soft_time_limit < conf.task_time_limit
