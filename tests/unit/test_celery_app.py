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
