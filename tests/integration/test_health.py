"""A real GPU-queue worker with its health endpoint: readiness follows the GPU's memory (a
file stands in for NVML on this machine) and pauses and resumes the worker's queues, and the
metrics of the work it did are scraped over HTTP."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from factory.stages import Stage
from tests.integration.cluster import Cluster, manifest
from tests.s3stand import free_port


def wait_for(check: Callable[[], bool], timeout: float = 30, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} {labels} in\n{text}")


def test_readiness_follows_gpu_memory_and_metrics_are_scraped(cluster: Cluster, tmp_path: Path):
    used = tmp_path / "gpu0-used"
    used.write_text("0.40")
    port = free_port()
    cluster.env_overrides.update(FACTORY_GPU_MEMORY_SOURCE=f"file:{used}",
                                 FACTORY_READINESS_EVERY="0.3")  # fmt: skip
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
    text = requests.get(f"{base}/metrics", timeout=5).text
    assert metric(text, "factory_queue_depth", queue="gpu") == 1
    assert metric(text, "factory_gpu_memory_used_ratio") == pytest.approx(0.97)

    used.write_text("0.93")  # below the limit but within the 5-point margin: still paused
    time.sleep(1.5)
    assert requests.get(f"{base}/readyz", timeout=2).status_code == 503
    used.write_text("0.50")
    wait_for(lambda: requests.get(f"{base}/readyz", timeout=2).status_code == 200, what="200")
    [done] = cluster.wait_done([job_id])
    assert done.stage is Stage.DONE, cluster.logs()

    text = requests.get(f"{base}/metrics", timeout=5).text
    segments = len(done.progress["segments"])
    count = metric(text, "factory_segment_seconds_count", family="procedural", resolution="96x64")
    assert count == segments  # counted in the worker's child process, served by its parent
    assert metric(text, "factory_jobs", stage="done") == 1
    assert metric(text, "factory_queue_depth", queue="gpu") == 0
    assert re.search(r'^factory_segment_seconds_bucket\{.*le="\+Inf".*\} ', text, re.M)
