"""A real GPU-queue worker with its health endpoint: readiness follows the GPU's memory (a
file stands in for NVML on this machine) and pauses and resumes the worker's queues, and the
metrics of the work it did are scraped over HTTP (with the metrics token). And a burst of
scrapes against the real server, collector and PostgreSQL: one pooled connection, one query."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg2
import pytest
import redis
import requests
from sqlalchemy.engine import make_url

from factory.db import migrate
from factory.db.session import Database
from factory.db.state import JobStateMachine
from factory.gpu.memory import NoMemory
from factory.infra import metrics
from factory.infra.health import HealthServer, Readiness
from factory.manifest import parse_manifest
from factory.stages import Stage
from tasks.health import _queue_depths
from tests.conftest import PG_ADMIN_DSN, manifest_text
from tests.integration.cluster import Cluster, manifest
from tests.s3stand import free_port_block

TOKEN = "metrics-token-for-the-test-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def wait_for(check: Callable[[], bool], timeout: float = 30, what: str = "",
             logs: Callable[[], str] | None = None) -> None:  # fmt: skip
    """Until `check()` holds; past `timeout`, fail with `what` and, given, `logs()` then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}" + (f"\n{logs()}" if logs else ""))


def metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} {labels} in\n{text}")


def test_readiness_follows_gpu_memory_and_metrics_are_scraped(cluster: Cluster, tmp_path: Path):
    used = tmp_path / "gpu0-used"
    used.write_text("0.40")
    port = free_port_block(1)
    cluster.env_overrides.update(FACTORY_GPU_MEMORY_SOURCE=f"file:{used}",
                                 FACTORY_READINESS_EVERY="0.3", FACTORY_METRICS_TOKEN=TOKEN,
                                 FACTORY_HEALTH_HOST="127.0.0.1",
                                 FACTORY_METRICS_CACHE="1")  # fmt: skip
    cluster.start("gpu0", "worker", "--gpu", "0", "--health-port", str(port))
    cluster.start("cpu", "worker", "--cpu")
    cluster.start("beat", "beat")
    cluster.wait_for_workers(2)
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: requests.get(f"{base}/readyz", timeout=2).status_code == 200, what="ready")
    assert requests.get(f"{base}/livez", timeout=2).json() == {"alive": True, "reason": "ok"}

    used.write_text("0.97")  # the card is nearly full: no new segment may land on it
    wait_for(lambda: requests.get(f"{base}/readyz", timeout=2).status_code == 503, what="503")
    assert "97.0% in use" in requests.get(f"{base}/readyz", timeout=2).json()["reason"]
    time.sleep(1.0)  # the cancel_consumer has gone through the worker's own loop by now
    [job_id] = cluster.submit(manifest(tmp_path / "m.yaml", "health", videos=1))
    time.sleep(3)
    job = cluster.factory().jobs.get(job_id)
    assert job.stage is Stage.QUEUED and not job.progress["segments"], "a paused worker took work"
    assert requests.get(f"{base}/metrics", timeout=5).status_code == 401  # no token
    text = requests.get(f"{base}/metrics", headers=AUTH, timeout=5).text
    assert metric(text, "factory_queue_depth", queue="gpu") == 1
    assert metric(text, "factory_gpu_memory_used_ratio") == pytest.approx(0.97)

    used.write_text("0.93")  # below the limit but within the 5-point margin: still paused
    time.sleep(1.5)
    assert requests.get(f"{base}/readyz", timeout=2).status_code == 503
    used.write_text("0.50")
    wait_for(lambda: requests.get(f"{base}/readyz", timeout=2).status_code == 200, what="200")
    [done] = cluster.wait_done([job_id])
    assert done.stage is Stage.DONE, cluster.logs()
    time.sleep(1.0)  # the jobs-by-stage read is kept FACTORY_METRICS_CACHE (1 s here)

    text = requests.get(f"{base}/metrics", headers=AUTH, timeout=5).text
    segments = len(done.progress["segments"])
    count = metric(text, "factory_segment_seconds_count", family="procedural", resolution="96x64")
    assert count == segments  # counted in the worker's child process, served by its parent
    assert metric(text, "factory_jobs", stage="done") == 1
    assert metric(text, "factory_queue_depth", queue="gpu") == 0
    assert re.search(r'^factory_segment_seconds_bucket\{.*le="\+Inf".*\} ', text, re.M)
    assert TOKEN not in cluster.logs()


class ConnectionSampler:
    """Samples pg_stat_activity in its own thread: the most connections seen to `database`,
    all of them and those of the metrics engine (its application_name)."""

    def __init__(self, database: str) -> None:
        self.database = database
        self.most = {"all": 0, "metrics": 0}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ConnectionSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        conn = psycopg2.connect(PG_ADMIN_DSN)  # to the postgres database: not counted
        # Autocommit, and no `with conn` (a transaction even so): pg_stat_activity is read
        # once per transaction, and every sample must be a new reading.
        conn.autocommit = True
        try:
            cur = conn.cursor()
            while True:
                stopping = self._stop.is_set()  # a last sample after the burst, then stop
                cur.execute(
                    "SELECT count(*), count(*) FILTER (WHERE application_name = %s) "
                    "FROM pg_stat_activity WHERE datname = %s",
                    (metrics.APPLICATION_NAME, self.database),
                )
                every, ours = cur.fetchone()
                self.most = {"all": max(self.most["all"], every),
                             "metrics": max(self.most["metrics"], ours)}  # fmt: skip
                self.samples += 1
                if stopping:
                    break
        finally:
            conn.close()


def burst(url: str, count: int) -> list[requests.Response]:
    """`count` scrapes, released at once."""
    start = threading.Barrier(count)

    def scrape() -> requests.Response:
        start.wait(60)
        return requests.get(url, headers=AUTH, timeout=60)

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(lambda _: scrape(), range(count)))


def test_a_burst_of_scrapes_holds_one_connection_and_makes_one_query(pg_url: str, redis_url):
    database = Database(pg_url)
    migrate.upgrade(database)
    machine = JobStateMachine(database)
    with database.transaction() as conn:
        machine.create(conn, "test", parse_manifest(manifest_text("burst", videos=3)).videos)
    database.dispose()  # from here on only the metrics path connects to this database
    broker = redis.Redis.from_url(redis_url)
    broker.rpush("gpu", b"one", b"two")

    engine = metrics.metrics_engine(pg_url)
    queries: list[int] = []

    def jobs_by_stage() -> dict[str, int]:
        queries.append(1)
        return metrics.jobs_by_stage(engine)

    def serve(cache: float) -> tuple[HealthServer, metrics.ClusterCollector]:
        collector = metrics.ClusterCollector(
            jobs_by_stage, lambda: _queue_depths(broker, ["gpu"]), cache=cache
        )
        metrics.add_collector(collector)
        server = HealthServer(0, Readiness(NoMemory()), lambda: None, metrics.exposition,
                              "127.0.0.1", max_requests=8, timeout=30,
                              metrics_token=TOKEN).start()  # fmt: skip
        return server, collector

    name = make_url(pg_url).database
    for cache in (600.0, 0.001):  # a burst within one period; then a refill at every scrape
        queries.clear()
        server, collector = serve(cache)
        try:
            with ConnectionSampler(name) as sampler:
                answers = burst(f"http://127.0.0.1:{server.port}/metrics", 150)
        finally:
            server.stop()
            metrics._extra.remove(collector)
        codes = [answer.status_code for answer in answers]
        assert set(codes) <= {200, 503}, codes
        served = [answer.text for answer in answers if answer.status_code == 200]
        assert served, codes
        for text in served:
            assert metric(text, "factory_jobs", stage="queued") == 3
            assert metric(text, "factory_queue_depth", queue="gpu") == 2
        for answer in answers:
            if answer.status_code == 503:
                assert answer.headers["Retry-After"] == "1"
        # the engine's pool: one connection, seen (it stays open for the next scrape)
        assert sampler.most["metrics"] == 1, sampler.most
        assert sampler.most["all"] <= 1, sampler.most  # and nothing else connects per scrape
        if cache == 600.0:
            assert len(queries) == 1  # 150 scrapes, one query
        else:
            assert 1 <= len(queries) <= len(served)
    engine.dispose()
