"""Shared fixtures: a real PostgreSQL database per test session, a real Redis, and SQLite.

PostgreSQL (127.0.0.1:5432, user postgres, trust auth) and Redis (127.0.0.1:6379) must be
running; `scripts/test` starts them when they are not. Nothing here is mocked.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

# Two pytest workers on two cores: each worker's torch (and the processes it starts) takes
# its share of the cores instead of all of them, which oversubscribes and slows both.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_name, str(max(1, (os.cpu_count() or 1) // _WORKERS)))

import psycopg2  # noqa: E402
import pytest  # noqa: E402
import redis  # noqa: E402

from factory.db import migrate  # noqa: E402
from factory.db.session import Database  # noqa: E402
from factory.db.state import JobStateMachine  # noqa: E402

PG_ADMIN_DSN = os.environ.get(
    "FACTORY_TEST_PG_ADMIN", "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
)
PG_URL_BASE = os.environ.get("FACTORY_TEST_PG_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432")


def worker_redis(url: str) -> str:
    """The Redis database of this pytest worker: pytest-xdist's worker N takes the database
    2N below the one named (13 and 12 for worker 0 or a serial run, 11 and 10 for worker 1,
    and so on), so parallel workers never flush each other's keys."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker.removeprefix("gw")) if worker.startswith("gw") else 0
    base, _, db = url.rpartition("/")
    number = int(db) - 2 * index
    if number < 0:
        raise RuntimeError(f"no Redis database left for pytest worker {worker} below {url}")
    return f"{base}/{number}"


REDIS_TEST_URL = worker_redis(os.environ.get("FACTORY_TEST_REDIS_URL", "redis://127.0.0.1:6379/13"))
REPO = Path(__file__).resolve().parent.parent


def _admin() -> psycopg2.extensions.connection:
    try:
        conn = psycopg2.connect(PG_ADMIN_DSN, connect_timeout=5)
    except psycopg2.OperationalError as exc:
        pytest.fail(f"PostgreSQL is not reachable ({exc}); `scripts/test` starts it", pytrace=False)
    conn.autocommit = True
    return conn


GPU_NODE_MODEL_ROOTS = ("/gpu-only", "/gpu-nodes-only", "/gpu-node-only-models")


# Which services a test needs, from the fixtures it uses (markers, pyproject.toml): `-m "not
# celery"` leaves out the tests that start workers, `-m fast` is the inner loop.
_SERVICE_FIXTURES = {
    "postgres": {"pg_url", "pg_database_factory", "cluster", "own_servers"},
    "redis": {"redis_url", "cluster", "own_servers"},
    "celery": {"cluster", "own_servers"},
    "s3": {"s3_stand", "bucket"},
}


# The dearest files first (from the suite's --durations): pytest-xdist hands out files in
# collection order, so the long ones start at once and the short ones fill in around them,
# instead of one long file running alone at the end while the other worker idles.
DEAREST_FIRST = (
    "tests/integration/test_latent_families.py",
    "tests/integration/test_diffusers.py",
    "tests/integration/test_celery.py",
    "tests/integration/test_examples.py",
    "tests/integration/test_trust.py",
    "tests/integration/test_lifecycle_model.py",
    "tests/integration/test_redo.py",
    "tests/integration/test_console_api.py",
    "tests/e2e/test_console_browser.py",
    "tests/integration/test_submit.py",
    "tests/integration/test_gc.py",
    "tests/integration/test_gpu_pool.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(DEAREST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for marker, fixtures in _SERVICE_FIXTURES.items():
            if used & fixtures:
                item.add_marker(marker)
        params = getattr(item, "callspec", None)
        if params and "postgres" in params.params.values():
            item.add_marker("postgres")  # any_url / migrated_db on PostgreSQL
        if "browser" in used:
            item.add_marker("browser")
        if item.nodeid.startswith("tests/unit/"):
            item.add_marker("fast")


def session_folder(tmp_path_factory) -> Path:
    """The temporary folder of the whole run: with pytest-xdist, the one above every worker's
    own (what one worker builds there, the others find)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Callable[[str], Path]:
    """tiny_model(NAME): the tiny random model NAME (tests/tiny_models.py ALL_SAVERS), built
    once for the whole run; a test that changes it copies it first."""
    from tests.tiny_models import cached

    root = session_folder(tmp_path_factory) / "tiny-models"
    return lambda name: cached(name, root)


class HomeSnapshot:
    """A FACTORY_HOME made once (a delivered batch, say) and put back as it was for each test
    that reads or changes it. The home is restored at the path it was made at, because the
    job records hold absolute file:// addresses into its store; the tests of one module run
    one after another on one worker, so one path per module is enough."""

    def __init__(self, folder: Path, make: Callable[[Path], None]) -> None:
        self.home, self._pristine, self._make = folder / "home", folder / "pristine", make

    def restore(self) -> Path:
        if not self._pristine.exists():
            shutil.rmtree(self.home, ignore_errors=True)
            self._make(self.home)
            shutil.copytree(self.home, self._pristine, symlinks=True)
        else:
            shutil.rmtree(self.home)
            shutil.copytree(self._pristine, self.home, symlinks=True)
        return self.home


@pytest.fixture(scope="session", autouse=True)
def _tests_allow_their_temp_folders(tmp_path_factory) -> None:
    """The tests' operator allows file:// assets and model directories in the tests' own
    temporary folders (FACTORY_ASSET_ROOTS, FACTORY_MODEL_ROOTS; factory/infra/confinement.py).
    Processes the tests start inherit it; tests of the confinement set their own."""
    base = str(session_folder(tmp_path_factory))
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


def run_cli_here(
    *args: str, env: dict[str, str], timeout: float | None = None
) -> subprocess.CompletedProcess:
    """`factory ARGS` through the same entry point (factory.cli.main) in this process: its
    exit code, stdout and stderr, without a new interpreter's start and imports (one to three
    seconds a call here) per call. For tests the process boundary is not about; run_cli stays
    the way to test what a user's process does (kill, signals, concurrency, start-up, the
    Celery app a process builds from its environment). ``timeout`` is pytest-timeout's here.

    As a process would: the environment is ``env`` over this one's and put back after, the
    working folder is the repository, stdin is empty, and the root logger is restored (the
    CLI points it at its stderr)."""
    from factory.cli.main import main

    del timeout
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    stdout, stderr = io.StringIO(), io.StringIO()
    os.environ.update(env)
    os.chdir(REPO)
    saved_stdin, sys.stdin = sys.stdin, io.StringIO("")
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                main(list(args))
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.stdin = saved_stdin
        os.chdir(saved_cwd)
        root.handlers[:], root.level = saved_handlers, saved_level
        os.environ.clear()
        os.environ.update(saved_env)
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
    from factory.infra import redact
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
