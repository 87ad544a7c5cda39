"""Shared fixtures: a real PostgreSQL database per test session, a real Redis, and SQLite.

PostgreSQL (127.0.0.1:5432, user postgres, trust auth) and Redis (127.0.0.1:6379) must be
running; `scripts/test` starts them when they are not. Nothing here is mocked.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest
import redis

from factory.db import migrate
from factory.db.session import Database
from factory.db.state import JobStateMachine

PG_ADMIN_DSN = os.environ.get(
    "FACTORY_TEST_PG_ADMIN", "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
)
PG_URL_BASE = os.environ.get("FACTORY_TEST_PG_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432")
REDIS_TEST_URL = os.environ.get("FACTORY_TEST_REDIS_URL", "redis://127.0.0.1:6379/13")
REPO = Path(__file__).resolve().parent.parent


def _admin() -> psycopg2.extensions.connection:
    try:
        conn = psycopg2.connect(PG_ADMIN_DSN, connect_timeout=5)
    except psycopg2.OperationalError as exc:
        pytest.fail(f"PostgreSQL is not reachable ({exc}); `scripts/test` starts it", pytrace=False)
    conn.autocommit = True
    return conn


GPU_NODE_MODEL_ROOTS = ("/gpu-only", "/gpu-nodes-only", "/gpu-node-only-models")


@pytest.fixture(scope="session", autouse=True)
def _tests_allow_their_temp_folders(tmp_path_factory) -> None:
    """The tests' operator allows file:// assets and model directories in the tests' own
    temporary folders (FACTORY_ASSET_ROOTS, FACTORY_MODEL_ROOTS; factory/confinement.py).
    Processes the tests start inherit it; tests of the confinement set their own."""
    base = str(tmp_path_factory.getbasetemp())
    os.environ["FACTORY_ASSET_ROOTS"] = base
    # and the folders that stand for model directories only GPU nodes mount (never created)
    os.environ["FACTORY_MODEL_ROOTS"] = ":".join([base, *GPU_NODE_MODEL_ROOTS])


@pytest.fixture(scope="session")
def pg_database_factory() -> Iterator:
    """Creates throwaway PostgreSQL databases; drops them all at the end of the session."""
    created: list[str] = []

    def make() -> str:
        name = f"factory_test_{uuid.uuid4().hex[:10]}"
        conn = _admin()
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        conn.close()
        created.append(name)
        return f"{PG_URL_BASE}/{name}"

    yield make
    conn = _admin()
    with conn.cursor() as cur:
        for name in created:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    conn.close()


@pytest.fixture
def pg_url(pg_database_factory) -> str:
    return pg_database_factory()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'factory.db'}"


@pytest.fixture(params=["sqlite", "postgres"])
def any_url(request, tmp_path: Path, pg_database_factory) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'factory.db'}"
    return pg_database_factory()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def migrated_db(request, tmp_path_factory, pg_database_factory) -> Iterator[Database]:
    """One migrated database per module and dialect; tests keep apart by unique batch names."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'factory.db'}"
    else:
        url = pg_database_factory()
    database = Database(url)
    migrate.upgrade(database)
    yield database
    database.dispose()


@pytest.fixture
def machine(migrated_db: Database) -> JobStateMachine:
    return JobStateMachine(migrated_db)


@pytest.fixture
def batch_name() -> str:
    return f"b-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def redis_url() -> str:
    client = redis.Redis.from_url(REDIS_TEST_URL)
    try:
        client.flushdb()
    except redis.ConnectionError as exc:
        pytest.fail(f"Redis is not reachable ({exc}); `scripts/test` starts it", pytrace=False)
    return REDIS_TEST_URL


def embedded_env(home: Path) -> dict[str, str]:
    """The newcomer's setup: nothing but FACTORY_HOME (the machine's FACTORY_* are blanked),
    and the folders the tests allow for file:// assets and model directories."""
    return {"FACTORY_HOME": str(home), "FACTORY_DATABASE_URL": "", "FACTORY_REDIS_URL": "",
            "FACTORY_BROKER_URL": "", "FACTORY_STORE_URL": "",
            **{name: os.environ[name] for name in ("FACTORY_ASSET_ROOTS", "FACTORY_MODEL_ROOTS")
               if name in os.environ}}  # fmt: skip


def manifest_text(
    batch: str, videos: int = 2, *, duration: float = 10, prompt: str = "a harbor"
) -> str:
    lines = [
        f"batch: {batch}",
        "defaults:",
        f"  duration: {duration}",
        "  resolution: 320x192",
        "  segment: {frames: 24, overlap: 4}",
        "videos:",
    ]
    for i in range(videos):
        lines.append(f"  - id: v{i:02d}")
        lines.append(f'    prompt: "{prompt} number {i}"')
    return "\n".join(lines) + "\n"


def run_cli(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `factory ARGS` the way a user does: a separate process, its real exit code."""
    full_env = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-m", "factory", *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def run_cli_here(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`factory ARGS` through the same entry point (factory.cli.main) in this process: its
    exit code, stdout and stderr, without a new interpreter's start (about 1.5 s) per call.
    For loops over many inputs; run_cli stays the way to test what a user's process does."""
    from factory.cli.main import main

    saved = dict(os.environ)
    stdout, stderr = io.StringIO(), io.StringIO()
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                main(list(args))
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return subprocess.CompletedProcess(
        ["factory", *args], code, stdout.getvalue(), stderr.getvalue()
    )


@pytest.fixture(autouse=True)
def _close_s3_stores() -> Iterator[None]:
    """S3 clients made by a test are closed when it ends, not by the garbage collector later."""
    yield
    if "factory.store.s3" in sys.modules:
        sys.modules["factory.store.s3"].close_all()


@pytest.fixture(scope="session")
def s3_stand(tmp_path_factory) -> Iterator:
    """moto's S3 server behind nginx with client-certificate verification (tests/s3stand.py)."""
    from factory import redact
    from tests.s3stand import ACCESS_KEY, SECRET_KEY, S3Stand

    os.environ.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
                      AWS_DEFAULT_REGION="us-east-1")  # fmt: skip
    redact.register_environment()
    stand = S3Stand(tmp_path_factory.mktemp("s3stand"))
    try:
        stand.start()
    except Exception:
        stand.stop()
        raise
    yield stand
    stand.stop()
