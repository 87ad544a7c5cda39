"""Prometheus metrics, served by every worker's health endpoint (`/metrics`).

Counted where the work happens (a worker's child processes, through prometheus_client's
multiprocess mode: `factory worker` gives each worker its own PROMETHEUS_MULTIPROC_DIR):

- `factory_segment_seconds` (histogram): one generated segment, by model family,
  resolution and GPU;
- `factory_qc_failures_total`: failed quality-gate checks, by check;
- `factory_delivered_bytes_total`: bytes put under final keys by the deliver stage.

Read at scrape time: `factory_jobs` (jobs by stage, from the database), `factory_queue_depth`
(messages waiting, by queue, from Redis) and `factory_gpu_memory_used_ratio` (the worker's
GPU, from the readiness check). Dashboards: docker/grafana-factory.json.

The database and Redis reads are kept for FACTORY_METRICS_CACHE seconds and refilled by one
scrape at a time, over one pooled connection per process (`metrics_engine`): a burst of
scrapes makes one query, never one connection each.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import create_engine, event, func, select
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.pool import QueuePool

log = logging.getLogger("factory.metrics")
T = TypeVar("T")
APPLICATION_NAME = "factory-metrics"  # pg_stat_activity tells these connections apart
QUERY_SECONDS = 5  # connect, pool and statement timeout of the metrics reads

SEGMENT_SECONDS = Histogram(
    "factory_segment_seconds",
    "Seconds to generate one segment (model, stitch, seam check, store).",
    ["family", "resolution", "gpu"],
    buckets=(0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1200, 2400),
)
QC_FAILURES = Counter("factory_qc_failures", "Failed quality-gate checks, by check.", ["check"])
DELIVERED_BYTES = Counter("factory_delivered_bytes", "Bytes delivered under final keys.")


def segment_done(family: str, resolution: str, gpu: str, seconds: float) -> None:
    SEGMENT_SECONDS.labels(family, resolution, gpu).observe(seconds)


def qc_failed(checks: list[str]) -> None:
    for check in checks:
        QC_FAILURES.labels(re.sub(r"_\d+", "", check)).inc()  # segment_12_spread -> segment_spread


def delivered(size: int) -> None:
    DELIVERED_BYTES.inc(size)


class Cached(Generic[T]):
    """The value of `read()`, kept `seconds`. One caller at a time refills it; the others
    meanwhile get the previous value, or wait (at most `wait` seconds) for the refill when
    there is none yet. A failed read is logged, gives None and is not retried before
    `seconds` have passed either: a database that is down is not asked at every scrape."""

    def __init__(
        self,
        read: Callable[[], T],
        seconds: float,
        *,
        what: str = "metrics",
        wait: float = QUERY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self.seconds = seconds
        self.what = what
        self.wait = wait
        self._clock = clock
        self._refill = threading.Lock()
        self._entry: tuple[T | None, float] | None = None  # (value, read at): swapped whole

    def get(self) -> T | None:
        entry = self._entry
        if entry is not None and self._fresh(entry[1]):
            return entry[0]
        previous = entry[0] if entry is not None else None
        if previous is not None:
            if not self._refill.acquire(blocking=False):
                return previous  # another scrape is refilling it
        elif not self._refill.acquire(timeout=self.wait):
            return None
        try:
            entry = self._entry
            if entry is not None and self._fresh(entry[1]):  # refilled while this one waited
                return entry[0]
            try:
                value: T | None = self._read()
            except Exception as error:
                log.warning("metrics.read_failed", extra={"what": self.what, "error": str(error)})
                value = None
            self._entry = (value, self._clock())
            return value
        finally:
            self._refill.release()

    def _fresh(self, read_at: float) -> bool:
        return self._clock() - read_at < self.seconds


class ClusterCollector(Collector):
    """Jobs by stage, queue depths and this worker's GPU memory, read when scraped (the first
    two through a `Cached` of `cache` seconds; a family whose read failed is left out)."""

    def __init__(
        self,
        jobs_by_stage: Callable[[], dict[str, int]] | None = None,
        queue_depths: Callable[[], dict[str, int]] | None = None,
        gpu_memory: Callable[[], float | None] | None = None,
        *,
        cache: float = 5.0,
    ) -> None:
        self.jobs_by_stage = Cached(jobs_by_stage, cache, what="jobs") if jobs_by_stage else None
        self.queue_depths = Cached(queue_depths, cache, what="queues") if queue_depths else None
        self.gpu_memory = gpu_memory

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self.jobs_by_stage is not None and (stages := self.jobs_by_stage.get()) is not None:
            family = GaugeMetricFamily("factory_jobs", "Jobs by stage.", labels=["stage"])
            for stage, count in sorted(stages.items()):
                family.add_metric([stage], count)
            yield family
        if self.queue_depths is not None and (depths := self.queue_depths.get()) is not None:
            family = GaugeMetricFamily(
                "factory_queue_depth", "Messages waiting, by queue.", labels=["queue"]
            )
            for queue, depth in sorted(depths.items()):
                family.add_metric([queue], depth)
            yield family
        if self.gpu_memory is not None and (used := self.gpu_memory()) is not None:
            yield GaugeMetricFamily(
                "factory_gpu_memory_used_ratio", "This worker's GPU memory in use.", value=used
            )


def metrics_engine(database_url: str) -> Engine:
    """The metrics reads' own engine, made once per process: one connection at most, checked
    before use, none of connect, checkout and query waiting longer than QUERY_SECONDS (the
    stages' engine, factory.db.session, pools up to 15). Made in a worker's main process,
    which forks its children: a connection is only ever used by the process that opened it."""
    parsed = make_url(database_url)
    connect_args: dict[str, Any] = {}
    if parsed.get_backend_name() == "postgresql":
        connect_args = {
            "application_name": APPLICATION_NAME,
            "connect_timeout": QUERY_SECONDS,
            "options": f"-c statement_timeout={QUERY_SECONDS * 1000}",
        }
    engine = create_engine(
        database_url,
        poolclass=QueuePool,
        pool_size=1,
        max_overflow=0,
        pool_timeout=QUERY_SECONDS,
        pool_pre_ping=True,
        connect_args=connect_args,
    )
    event.listen(engine, "connect", _remember_pid)
    event.listen(engine, "checkout", _only_in_its_process)
    return engine


def _remember_pid(_dbapi_conn: Any, record: Any) -> None:
    record.info["pid"] = os.getpid()


def _only_in_its_process(_dbapi_conn: Any, record: Any, proxy: Any) -> None:
    if record.info.get("pid") != os.getpid():
        # Forget the parent's connection without closing it (it is the parent's to close).
        record.dbapi_connection = proxy.dbapi_connection = None
        raise DisconnectionError("connection opened by another process")


def jobs_by_stage(engine: Engine) -> dict[str, int]:
    from factory.db.models import jobs

    with engine.connect() as conn:
        rows = conn.execute(select(jobs.c.stage, func.count()).group_by(jobs.c.stage)).all()
    return {stage: count for stage, count in rows}


_extra: list[Collector] = []


def add_collector(collector: Collector) -> None:
    _extra.append(collector)


def exposition() -> tuple[bytes, str]:
    """The text a Prometheus scrape gets: every process of this worker, plus the collectors."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry: Any = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    else:
        registry = CollectorRegistry()
        for collector in (SEGMENT_SECONDS, QC_FAILURES, DELIVERED_BYTES):
            registry.register(collector)
    for collector in _extra:
        registry.register(collector)
    return generate_latest(registry), CONTENT_TYPE_LATEST
