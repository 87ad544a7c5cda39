"""The CLI run as a user runs it: a separate process, real databases, its real exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import func, select

from factory.db import migrate
from factory.db.models import batches, jobs
from factory.db.session import Database
from tests import conftest
from tests.conftest import manifest_text, run_cli, run_cli_here
from tests.unit.test_manifest import BAD_CASES


@pytest.fixture
def embedded_env(tmp_path: Path) -> dict[str, str]:
    return conftest.embedded_env(tmp_path / "home")


@pytest.fixture
def postgres_env(tmp_path: Path, pg_url: str, redis_url: str) -> dict[str, str]:
    return {
        "FACTORY_HOME": str(tmp_path / "home"),
        "FACTORY_DATABASE_URL": pg_url,
        "FACTORY_REDIS_URL": redis_url,
        "FACTORY_BROKER_URL": "",
        "FACTORY_STORE_URL": "",
    }


def ok(*args: str, env: dict[str, str]) -> str:
    result = run_cli(*args, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_embedded_flow(tmp_path: Path, embedded_env: dict[str, str]):
    manifest = tmp_path / "nightly.yaml"
    manifest.write_text(manifest_text("nightly", videos=3))
    first = run_cli("submit", str(manifest), env=embedded_env)
    assert first.returncode == 0, first.stderr
    ids = first.stdout.split()
    assert ids == ["nightly.v00", "nightly.v01", "nightly.v02"]
    assert "3 created, 0 already submitted" in first.stderr
    assert (tmp_path / "home" / "factory.db").exists()

    again = run_cli("submit", str(manifest), env=embedded_env)
    assert again.stdout.split() == ids and "0 created, 3 already submitted" in again.stderr

    table = ok("jobs", env=embedded_env)
    assert all(job_id in table for job_id in ids) and "queued" in table
    listed = json.loads(ok("jobs", "--json", "--batch", "nightly", env=embedded_env))
    assert [j["job_id"] for j in listed] == ids
    assert listed[0]["progress"]["segments_total"] == 12  # 240 frames, 24 per segment, 4 overlap

    status = ok("status", "nightly.v01", env=embedded_env)
    assert "nightly.v01" in status and "queued" in status and "segments 0/12" in status

    cancelled = json.loads(
        ok("cancel", "nightly.v01", "--reason", "typo", "--json", env=embedded_env)
    )
    assert cancelled["stage"] == "cancelled" and cancelled["stopped_stage"] == "queued"
    assert "requeue nightly.v01" in ok("status", "nightly.v01", env=embedded_env)
    assert (
        json.loads(ok("jobs", "--stage", "cancelled", "--json", env=embedded_env))[0]["job_id"]
        == "nightly.v01"
    )

    requeued = json.loads(ok("requeue", "nightly.v01", "--json", env=embedded_env))
    assert requeued["stage"] == "queued" and requeued["attempt"] == 2

    timeline = json.loads(ok("events", "nightly.v01", "--json", env=embedded_env))
    assert [e["event"] for e in timeline] == ["submitted", "cancelled", "requeued"]
    assert timeline[1]["detail"]["reason"] == "typo"
    assert len({e["trace_id"] for e in timeline}) == 1
    assert "requeued" in ok("events", "nightly.v01", env=embedded_env)


def test_postgres_flow_needs_an_upgraded_schema(tmp_path: Path, postgres_env: dict[str, str]):
    manifest = tmp_path / "m.yaml"
    manifest.write_text(manifest_text("pg", videos=2))
    refused = run_cli("submit", str(manifest), env=postgres_env)
    assert refused.returncode == 1 and "run `factory db upgrade`" in refused.stderr
    assert "Traceback" not in refused.stderr
    head = migrate.head_revision()
    assert f"database at revision {head} (was empty)" in ok("db", "upgrade", env=postgres_env)
    rows = json.loads(ok("submit", str(manifest), "--json", env=postgres_env))
    assert [(r["job_id"], r["stage"], r["created"]) for r in rows] == [
        ("pg.v00", "queued", True),
        ("pg.v01", "queued", True),
    ]
    rows = json.loads(ok("submit", str(manifest), "--json", env=postgres_env))
    assert [r["created"] for r in rows] == [False, False]
    status = json.loads(ok("status", "pg.v00", "--json", env=postgres_env))
    assert status["spec"]["video_id"] == "v00" and status["attempt"] == 0
    assert f"current {head}, head {head}" in ok("db", "current", env=postgres_env)
    assert "base" in ok("db", "downgrade", "base", env=postgres_env)


def test_batch_override_for_cron(tmp_path: Path, embedded_env: dict[str, str]):
    manifest = tmp_path / "m.yaml"
    manifest.write_text(manifest_text("nightly", videos=1))
    assert ok(
        "submit", str(manifest), "--batch", "nightly-2026-11-29", env=embedded_env
    ).split() == ["nightly-2026-11-29.v00"]
    assert ok(
        "submit", str(manifest), "--batch", "nightly-2026-11-30", env=embedded_env
    ).split() == ["nightly-2026-11-30.v00"]


def test_validate_prints_the_plan_and_writes_nothing(tmp_path: Path, embedded_env: dict[str, str]):
    manifest = tmp_path / "m.yaml"
    manifest.write_text(manifest_text("v", videos=2))
    output = ok("validate", str(manifest), env=embedded_env)
    assert "v.v00" in output and "manifest ok: 2 videos" in output
    assert not (tmp_path / "home").exists()


def test_bad_manifests_exit_2_name_the_field_and_write_nothing(
    tmp_path: Path, postgres_env: dict[str, str], embedded_env: dict[str, str]
):
    database = Database(postgres_env["FACTORY_DATABASE_URL"])
    migrate.upgrade(database)
    # The first case in a process of its own, as a user runs it; the others through the same
    # entry point in this process (62 interpreter starts cost about two minutes).
    for number, (path, expect, says) in enumerate(BAD_CASES):
        runner = run_cli if number == 0 else run_cli_here
        result = runner("submit", str(path), env=postgres_env)
        assert result.returncode == 2, (path.name, result.stderr)
        assert f"{expect}: " in result.stderr if expect else "problem" in result.stderr
        assert says in result.stderr, (path.name, result.stderr)
        assert "Traceback" not in result.stderr
    with database.transaction() as conn:
        assert conn.scalar(select(func.count()).select_from(jobs)) == 0
        assert conn.scalar(select(func.count()).select_from(batches)) == 0
    database.dispose()
    result = run_cli("submit", str(BAD_CASES[0][0]), env=embedded_env)
    assert result.returncode == 2 and not (tmp_path / "home").exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["status", "no.such-job"], "no job with id 'no.such-job'"),
        (["requeue", "no.such-job"], "no job with id"),
        (["cancel", "no.such-job"], "no job with id"),
        (["events", "no.such-job"], "no job with id"),
        (["jobs", "--stage", "sideways"], "--stage: unknown stage 'sideways'"),
        (["requeue", "x", "--from", "nowhere"], "--from: unknown stage 'nowhere'"),
        (["submit"], "Missing argument"),
        (["frobnicate"], "No such command"),
    ],
)
def test_bad_arguments_exit_2(embedded_env: dict[str, str], args: list[str], says: str):
    result = run_cli(*args, env=embedded_env)
    assert result.returncode == 2, result.stderr
    assert says in result.stderr and "Traceback" not in result.stderr


def test_operator_refusals_exit_2(tmp_path: Path, embedded_env: dict[str, str]):
    manifest = tmp_path / "m.yaml"
    manifest.write_text(manifest_text("ops", videos=1))
    ok("submit", str(manifest), env=embedded_env)
    ok("cancel", "ops.v00", env=embedded_env)
    again = run_cli("cancel", "ops.v00", env=embedded_env)
    assert again.returncode == 2 and "already cancelled" in again.stderr
    ahead = run_cli("requeue", "ops.v00", "--from", "deliver", env=embedded_env)
    assert ahead.returncode == 2 and "only reached queued" in ahead.stderr


def test_infrastructure_failure_exits_1_without_a_traceback(tmp_path: Path):
    env = {
        "FACTORY_HOME": str(tmp_path),
        "FACTORY_DATABASE_URL": "postgresql+psycopg2://postgres@127.0.0.1:1/none",
    }
    result = run_cli("jobs", env=env)
    assert result.returncode == 1 and "database unavailable" in result.stderr
    assert "Traceback" not in result.stderr
    debug = run_cli("--debug", "jobs", env=env)
    assert debug.returncode == 1 and "Traceback" in debug.stderr


def test_bad_setting_names_the_variable(tmp_path: Path):
    result = run_cli("jobs", env={"FACTORY_HOME": str(tmp_path), "FACTORY_STALE_AFTER": "soon"})
    assert result.returncode == 2 and "FACTORY_STALE_AFTER" in result.stderr


# What the everyday commands must not import (issue 35): each costs a large part of a second
# before the command does anything, and none of them is needed to list or show jobs.
HEAVY = ("alembic", "numpy", "torch", "celery", "av", "PIL", "redis", "diffusers", "boto3")


@pytest.mark.parametrize("argv", [["--help"], ["jobs"], ["status", "imports.v00"]])
def test_the_everyday_commands_import_nothing_heavy(
    embedded_env: dict[str, str], tmp_path: Path, argv: list[str]
) -> None:
    manifest = tmp_path / "m.yaml"
    manifest.write_text(manifest_text("imports", 1))
    ok("submit", str(manifest), env=embedded_env)  # (a schema made: the check reads it)
    probe = (
        "import sys\n"
        "from factory.cli.main import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        f"print('IMPORTED', [m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], env={**os.environ, **embedded_env},
        capture_output=True, text=True, cwd=conftest.REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "IMPORTED []" in done.stdout, done.stdout.splitlines()[-1]
