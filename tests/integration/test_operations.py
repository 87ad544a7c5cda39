"""The operations layer on its own (issue 36): SQLite, real ffmpeg, and a dispatcher that
records what it is given. The rules every interface shares are checked here once: what is
sent where, the redo seed, the one preflight; and a web process whose broker is away keeps
the operator's action, as the CLI does."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from factory.access import Access
from factory.config import Settings
from factory.errors import BadInput
from factory.job import Job
from factory.ops import Operations
from factory.stages import Stage
from factory.wiring import Factory
from tests.conftest import HomeSnapshot, embedded_env, run_cli_here
from tests.s3stand import free_port

TINY = (
    "batch: ops\ndefaults: {duration: 4, fps: 12, resolution: 160x96, "
    "segment: {frames: 24, overlap: 4}, renditions: [mobile], seed: 5}\n"
    "videos:\n  - {id: clip, prompt: 'a harbor at dawn, slow pan'}\n"
)


class Recorder:
    """A dispatcher that keeps what it is sent."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def __call__(self, found: list[Job]) -> None:
        self.sent += [job.job_id for job in found]


def operations(home: Path, dispatcher: Recorder | None = None) -> Operations:
    return Operations(Factory.open(Settings.from_env(embedded_env(home))), dispatcher=dispatcher)


def _deliver(home: Path) -> None:
    ops = operations(home)
    ops.submit_text(TINY, fmt="yaml", actor="test:ann")
    assert ops.run_here("ops.clip", "test").stage is Stage.DONE


@pytest.fixture(scope="module")
def delivered_home(tmp_path_factory) -> HomeSnapshot:
    return HomeSnapshot(tmp_path_factory.mktemp("ops-v1"), _deliver)


def test_submitted_jobs_go_to_the_dispatcher_once(tmp_path: Path) -> None:
    sent = Recorder()
    ops = operations(tmp_path / "home", sent)
    assert not ops.in_process
    first = ops.submit_text(TINY, fmt="yaml", actor="test:ann")
    assert first.created == ["ops.clip"] and sent.sent == ["ops.clip"]
    again = ops.submit_text(TINY, fmt="yaml", actor="test:ann")
    assert again.created == [] and sent.sent == ["ops.clip"]  # a resubmission sends nothing
    ops.cancel("ops.clip", reason="wrong prompt", actor="test:ann")
    assert sent.sent == ["ops.clip"]  # a cancel sends nothing
    ops.requeue("ops.clip", from_stage=None, actor="test:ann")
    assert sent.sent == ["ops.clip", "ops.clip"]


def test_without_a_dispatcher_work_is_recorded_for_a_run_here(tmp_path: Path) -> None:
    ops = operations(tmp_path / "home")
    assert ops.in_process
    ops.submit_text(TINY, fmt="yaml", actor="test:ann")
    assert ops.job("ops.clip").stage is Stage.QUEUED


def test_the_one_preflight_refuses_a_missing_asset_naming_its_field(tmp_path: Path) -> None:
    ops = operations(tmp_path / "home", Recorder())
    text = TINY.replace("slow pan'}", "slow pan', audio: {bed: 'store://beds/none.flac'}}")
    with pytest.raises(BadInput) as refused:
        ops.submit_text(text, fmt="yaml", actor="test:ann")
    assert "audio" in str(refused.value.field or refused.value)
    assert ops.jobs(batch="ops").items == []  # nothing half-created


def test_a_redo_without_seed_or_prompt_gets_a_new_recorded_seed(delivered_home) -> None:
    sent = Recorder()
    ops = operations(delivered_home.restore(), sent)
    plan, job = ops.redo("ops.clip", range_text="0:01-0:02", actor="test:bob")
    seed = job.progress["redo"]["seed"]
    assert isinstance(seed, int) and 0 <= seed < 2**31
    assert sent.sent == ["ops.clip"] and plan.version == 2


def test_a_redo_of_the_prompt_alone_keeps_the_seeds(delivered_home) -> None:
    ops = operations(delivered_home.restore(), Recorder())
    _, job = ops.redo("ops.clip", range_text="0:01-0:02", actor="test:bob", prompt="a gull")
    assert job.progress["redo"]["seed"] is None
    assert job.progress["redo"]["prompt"] == "a gull"


def test_a_redo_takes_a_given_seed_and_refuses_a_seed_with_new_seed(delivered_home) -> None:
    ops = operations(delivered_home.restore(), Recorder())
    with pytest.raises(BadInput) as both:
        ops.redo("ops.clip", range_text="0:01-0:02", actor="test:bob", seed=7, new_seed=True)
    assert both.value.field == "--seed"
    assert ops.job("ops.clip").stage is Stage.DONE  # refused before anything was written
    _, job = ops.redo("ops.clip", range_text="0:01-0:02", actor="test:bob", seed=7)
    assert job.progress["redo"]["seed"] == 7


def test_a_server_whose_broker_is_away_keeps_the_action(tmp_path: Path, caplog) -> None:
    """The API's requeue with the broker down: recorded (the sweeper sends it later), logged,
    and answered as done, as `factory requeue` does (before, the web side had no such rule)."""
    from factory.web.server import create_app

    home = tmp_path / "home"
    ops = operations(home)
    ops.submit_text(TINY, fmt="yaml", actor="test:ann")
    ops.cancel("ops.clip", reason="paused for the test", actor="test:ann")
    away = f"redis://127.0.0.1:{free_port()}/0"
    settings = Settings.from_env(embedded_env(home) | {"FACTORY_BROKER_URL": away})
    factory = Factory.open(settings)
    _, token = Access(factory.database).create_token("ops", "operator")
    with (
        TestClient(create_app(settings, factory=factory)) as client,
        caplog.at_level(logging.WARNING, logger="factory.web"),
    ):
        answer = client.post(
            "/api/v1/jobs/ops.clip/requeue",
            json={},
            headers={"Authorization": f"Bearer {token}"},
        )
    assert answer.status_code == 200, answer.text
    assert ops.job("ops.clip").stage is Stage.QUEUED
    assert any(r.message == "dispatch.broker_away" for r in caplog.records)


def test_factory_status_json_is_the_api_s_job(delivered_home) -> None:
    """One job view: the CLI's `status --json` and the API's job are the same document."""
    from factory.web.server import create_app

    home = delivered_home.restore()
    env = embedded_env(home)
    settings = Settings.from_env(env)
    factory = Factory.open(settings)
    _, token = Access(factory.database).create_token("ops", "viewer")
    with TestClient(create_app(settings, factory=factory)) as client:
        answer = client.get("/api/v1/jobs/ops.clip", headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200, answer.text
    shown = run_cli_here("status", "ops.clip", "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == answer.json()
    assert answer.json()["actions"] == ["redo", "requeue"]
