"""Redis and PostgreSQL with passwords, as docker/ deploys them: a factory process without the
password is refused, one with it works, and the password is never printed nor put on a
command line.

The machine's own PostgreSQL trusts every local connection, so the tests start their own
servers: a Redis with `requirepass` (from a config file, not argv) and a PostgreSQL cluster
made with initdb and scram-sha-256 authentication."""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.integration.cluster import manifest, new_cluster
from tests.services import new_password, start_postgres, start_redis


@pytest.fixture(scope="module")
def redis_with_password(tmp_path_factory) -> Iterator[tuple[int, str]]:
    server = start_redis(tmp_path_factory.mktemp("redis-auth"), new_password("rpw"))
    yield server.port, server.password
    server.stop()


@pytest.fixture(scope="module")
def postgres_with_password() -> Iterator[tuple[int, str]]:
    """A PostgreSQL cluster of its own with scram-sha-256 for every connection; yields its
    port and the password of role `factory`, which owns database `factory`."""
    server = start_postgres(admin_password=new_password("admin"))
    password = new_password("ppw")
    try:
        server.sql(f"CREATE ROLE factory LOGIN PASSWORD '{password}'")
        server.sql("CREATE DATABASE factory OWNER factory")
        yield server.port, password
    finally:
        server.stop()


def _pg(port: int, password: str | None) -> str:
    auth = f"factory:{password}" if password else "factory"
    return f"postgresql+psycopg2://{auth}@127.0.0.1:{port}/factory"


def _env(tmp_path: Path, database_url: str) -> dict[str, str]:
    return {"FACTORY_HOME": str(tmp_path / "home"), "FACTORY_DATABASE_URL": database_url,
            "FACTORY_BROKER_URL": "", "FACTORY_REDIS_URL": "", "FACTORY_STORE_URL": ""}  # fmt: skip


def test_postgresql_refuses_the_factory_without_its_password_and_never_prints_it(
    postgres_with_password, tmp_path: Path
):
    port, password = postgres_with_password
    without = run_cli("db", "upgrade", env=_env(tmp_path, _pg(port, None)))
    assert without.returncode != 0 and "password" in without.stderr.lower(), without.stderr
    wrong = "wrong-" + secrets.token_hex(8)
    refused = run_cli("db", "upgrade", env=_env(tmp_path, _pg(port, wrong)))
    assert refused.returncode != 0
    assert "password authentication failed" in refused.stderr, refused.stderr
    assert wrong not in refused.stdout + refused.stderr
    done = run_cli("db", "upgrade", env=_env(tmp_path, _pg(port, password)))
    assert done.returncode == 0, done.stderr
    status = run_cli("jobs", env=_env(tmp_path, _pg(port, password)))
    assert status.returncode == 0, status.stderr
    for result in (without, refused, done, status):
        assert password not in result.stdout + result.stderr


def _cmdlines(pids: list[int]) -> str:
    text = ""
    for pid in pids:
        with contextlib.suppress(OSError):  # gone meanwhile
            text += Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return text


def _tree(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        out = subprocess.run(["pgrep", "-P", str(current)], capture_output=True, text=True)
        todo += [int(p) for p in out.stdout.split()]
    return found


def test_redis_refuses_a_worker_without_its_password_and_serves_one_with_it(
    redis_with_password, postgres_with_password, tmp_path: Path
):
    redis_port, redis_password = redis_with_password
    pg_port, pg_password = postgres_with_password
    database_url = _pg(pg_port, pg_password)
    assert run_cli("db", "upgrade", env=_env(tmp_path, database_url)).returncode == 0
    for name in ("refused", "served"):
        (tmp_path / name).mkdir()
    refused = new_cluster(tmp_path / "refused", database_url)
    bare = f"redis://127.0.0.1:{redis_port}/0"
    refused.env_overrides.update(FACTORY_BROKER_URL=bare, FACTORY_REDIS_URL=bare)
    try:
        refused.start("cpu", "worker", "--cpu", "--concurrency", "1")
        log = refused.home / "cpu.log"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and b"Authentication required" not in log.read_bytes():
            time.sleep(0.5)
        text = log.read_text(errors="replace")
        assert "Authentication required" in text, text[-3000:]
        assert "ready." not in text  # it never consumed anything
    finally:
        refused.stop()

    served = new_cluster(tmp_path / "served", database_url)
    url = f"redis://:{redis_password}@127.0.0.1:{redis_port}/0"
    served.env_overrides.update(FACTORY_BROKER_URL=url, FACTORY_REDIS_URL=url)
    try:
        served.start_workers(gpus=1, cpu=True, beat=False)
        path = manifest(tmp_path / "m.yaml", "authed", videos=1, seconds_per_segment=0.2,
                        duration=4)  # fmt: skip
        [job_id] = served.submit(path)
        [job] = served.wait_done([job_id], timeout=300)
        assert job.stage.value == "done", served.logs()
        pids = [pid for proc in served.processes.values() for pid in _tree(proc.pid)]
        assert len(pids) >= 4  # the workers and their pool children
        cmdlines = _cmdlines(pids)
        assert "celery" in cmdlines
        assert redis_password not in cmdlines and pg_password not in cmdlines
        logs = served.logs()
        assert redis_password not in logs and pg_password not in logs
    finally:
        served.stop()
