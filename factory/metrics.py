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
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

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


class ClusterCollector(Collector):
    """Jobs by stage, queue depths and this worker's GPU memory, read when scraped."""

    def __init__(
        self,
        jobs_by_stage: Callable[[], dict[str, int]] | None = None,
        queue_depths: Callable[[], dict[str, int]] | None = None,
        gpu_memory: Callable[[], float | None] | None = None,
    ) -> None:
        self.jobs_by_stage = jobs_by_stage
        self.queue_depths = queue_depths
        self.gpu_memory = gpu_memory

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self.jobs_by_stage is not None:
            family = GaugeMetricFamily("factory_jobs", "Jobs by stage.", labels=["stage"])
            for stage, count in sorted(self.jobs_by_stage().items()):
                family.add_metric([stage], count)
            yield family
        if self.queue_depths is not None:
            family = GaugeMetricFamily(
                "factory_queue_depth", "Messages waiting, by queue.", labels=["queue"]
            )
            for queue, depth in sorted(self.queue_depths().items()):
                family.add_metric([queue], depth)
            yield family
        if self.gpu_memory is not None and (used := self.gpu_memory()) is not None:
            yield GaugeMetricFamily(
                "factory_gpu_memory_used_ratio", "This worker's GPU memory in use.", value=used
            )


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
