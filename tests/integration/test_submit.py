"""Idempotent, all-or-nothing submission, with and without the Redis fast path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from sqlalchemy import func, select

from factory.db import migrate
from factory.db.models import batches, job_events, jobs
from factory.db.session import Database
from factory.db.state import JobStateMachine
from factory.errors import SpecConflict
from factory.infra.idempotency import KEY_PREFIX, SubmitTokens
from factory.manifest import parse_manifest
from factory.ops.submit import submit
from tests.conftest import REPO, manifest_text


def counts(database: Database, batch: str) -> tuple[int, int, int]:
    with database.transaction() as conn:
        n_batches = conn.scalar(
            select(func.count()).select_from(batches).where(batches.c.batch == batch)
        )
        n_jobs = conn.scalar(select(func.count()).select_from(jobs).where(jobs.c.batch == batch))
        n_events = conn.scalar(
            select(func.count()).select_from(job_events).join(jobs).where(jobs.c.batch == batch)
        )
    return n_batches, n_jobs, n_events


@pytest.mark.parametrize("with_redis", [False, True], ids=["db-only", "redis"])
def test_resubmission_creates_nothing_and_returns_the_same_ids(
    machine: JobStateMachine, batch_name: str, redis_url: str, with_redis: bool
):
    tokens = SubmitTokens(redis_url, 600) if with_redis else None
    manifest = parse_manifest(manifest_text(batch_name, videos=3))
    first = submit(manifest, machine, tokens)
    assert first.created == [j.job_id for j in first.jobs] and len(first.created) == 3
    again = submit(manifest, machine, tokens)
    assert again.created == [] and [j.job_id for j in again.jobs] == first.created
    assert again.fast_path is with_redis
    assert counts(machine.database, batch_name) == (1, 3, 3)


def test_same_id_with_a_different_spec_is_refused_and_nothing_is_written(
    machine: JobStateMachine, batch_name: str, redis_url: str
):
    tokens = SubmitTokens(redis_url, 600)
    submit(parse_manifest(manifest_text(batch_name, videos=1)), machine, tokens)
    changed = parse_manifest(manifest_text(batch_name, videos=3, prompt="a different prompt"))
    with pytest.raises(SpecConflict) as caught:
        submit(changed, machine, tokens)
    assert caught.value.field == "videos[0]" and caught.value.exit_code == 2
    # All or nothing: v01 and v02 were new but are not created either.
    assert counts(machine.database, batch_name) == (1, 1, 1)
    client = redis.Redis.from_url(redis_url)
    assert client.get(f"{KEY_PREFIX}{batch_name}.v01") is None
    original = machine.get(f"{batch_name}.v00")
    assert original.spec["scenes"][0]["prompt"] == "a harbor number 0"


def test_a_stale_redis_token_does_not_hide_a_missing_job(
    machine: JobStateMachine, batch_name: str, redis_url: str
):
    manifest = parse_manifest(manifest_text(batch_name, videos=2))
    client = redis.Redis.from_url(redis_url)
    for video in manifest.videos:  # a submitter that set its tokens, then crashed
        client.set(KEY_PREFIX + video.job_id, video.sha256())
    result = submit(manifest, machine, SubmitTokens(redis_url, 600))
    assert len(result.created) == 2 and not result.fast_path


def test_redis_down_falls_back_to_the_database(machine: JobStateMachine, batch_name: str):
    dead = SubmitTokens("redis://127.0.0.1:1/0", 600)
    manifest = parse_manifest(manifest_text(batch_name, videos=2))
    assert len(submit(manifest, machine, dead).created) == 2
    assert submit(manifest, machine, dead).created == []


def test_adding_a_video_to_a_batch_creates_only_the_new_job(
    machine: JobStateMachine, batch_name: str
):
    submit(parse_manifest(manifest_text(batch_name, videos=2)), machine, None)
    grown = submit(parse_manifest(manifest_text(batch_name, videos=3)), machine, None)
    assert grown.created == [f"{batch_name}.v02"]


def concurrent_submissions(url: str, redis_url: str, manifest: Path, processes: int) -> list[dict]:
    """`factory submit --json` from many processes at once, as cron on several hosts would."""
    env = {**os.environ, "FACTORY_DATABASE_URL": url, "FACTORY_REDIS_URL": redis_url}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "factory", "submit", str(manifest), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=env,
        )
        for _ in range(processes)
    ]
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr
        rows = json.loads(stdout)
        results.append(
            {
                "ids": [r["job_id"] for r in rows],
                "created": [r["job_id"] for r in rows if r["created"]],
            }
        )
    return results


@pytest.mark.parametrize(
    ("dialect", "with_redis", "processes"),
    [("postgres", True, 50), ("postgres", False, 50), ("sqlite", False, 16)],
    ids=["postgres+redis-50", "postgres-50", "sqlite-16"],
)
def test_concurrent_submissions_create_each_job_once(
    tmp_path: Path,
    pg_database_factory,
    redis_url: str,
    dialect: str,
    with_redis: bool,
    processes: int,
):
    url = pg_database_factory() if dialect == "postgres" else f"sqlite:///{tmp_path / 'f.db'}"
    database = Database(url)
    migrate.upgrade(database)
    manifest = tmp_path / "nightly.yaml"
    manifest.write_text(manifest_text("concurrent", videos=8))
    results = concurrent_submissions(url, redis_url if with_redis else "", manifest, processes)
    expected = [f"concurrent.v{i:02d}" for i in range(8)]
    assert all(r["ids"] == expected for r in results)
    created = [job_id for r in results for job_id in r["created"]]
    assert sorted(created) == expected  # every job created by exactly one process
    assert counts(database, "concurrent") == (1, 8, 8)
    database.dispose()
