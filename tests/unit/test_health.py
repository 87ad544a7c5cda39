"""Readiness by GPU memory (with hysteresis), the health endpoints over real HTTP, and the
metrics text, with a file standing in for NVML."""

from __future__ import annotations

from pathlib import Path

import requests

from factory import metrics
from factory.generate.gpu_memory import FileMemory, NoMemory, open_memory_source
from factory.health import HealthServer, Readiness


def test_readiness_pauses_above_the_limit_and_resumes_clearly_below(tmp_path: Path) -> None:
    used = tmp_path / "used"
    calls: list[str] = []
    readiness = Readiness(FileMemory(used), 0.95, lambda: calls.append("pause"),
                          lambda: calls.append("resume"))  # fmt: skip
    for value, ready in (("0.50", True), ("0.96", False), ("0.93", False), ("0.97", False),
                         ("0.89", True), ("0.94", True)):  # fmt: skip
        used.write_text(value)
        assert readiness.check() is ready, value
    assert calls == ["pause", "resume"]
    assert "94.0% in use (limit 95%" in readiness.reason
    used.write_text("garbage")
    assert readiness.check() is True and "no GPU memory reading" in readiness.reason


def test_memory_sources() -> None:
    assert isinstance(open_memory_source("none", 0), NoMemory)
    assert isinstance(open_memory_source("nvml", None), NoMemory)  # a CPU worker
    source = open_memory_source("file:/nonexistent", 0)
    assert isinstance(source, FileMemory) and source.read() is None


def test_the_endpoints_answer_over_http(tmp_path: Path) -> None:
    used = tmp_path / "used"
    used.write_text("60000 80000")
    readiness = Readiness(FileMemory(used), 0.7)
    problem: list[str] = []
    server = HealthServer(0, readiness, lambda: problem[0] if problem else None,
                          metrics.exposition, host="127.0.0.1").start()  # fmt: skip
    base = f"http://127.0.0.1:{server.port}"
    try:
        readiness.check()
        assert requests.get(f"{base}/livez", timeout=5).status_code == 200
        ready = requests.get(f"{base}/readyz", timeout=5)
        assert ready.status_code == 503 and ready.json()["used"] == 60000
        used.write_text("1000 80000")
        readiness.check()
        assert requests.get(f"{base}/readyz", timeout=5).json()["ready"] is True
        problem.append("broker unreachable: connection refused")
        live = requests.get(f"{base}/livez", timeout=5)
        assert live.status_code == 503 and "broker unreachable" in live.json()["reason"]
        metrics.segment_done("wan", "832x480", "NVIDIA H100", 42.0)
        metrics.qc_failed(["mobile.vmaf", "seams.seam_12_jump"])
        metrics.delivered(1234)
        text = requests.get(f"{base}/metrics", timeout=5).text
        assert (
            'factory_segment_seconds_count{family="wan",gpu="NVIDIA H100",resolution="832x480"}'
            in text
        )
        assert 'factory_qc_failures_total{check="seams.seam_jump"}' in text
        assert "factory_delivered_bytes_total" in text
        assert requests.get(f"{base}/nothing", timeout=5).status_code == 404
    finally:
        server.stop()


def test_the_grafana_dashboard_only_queries_metrics_the_factory_exports() -> None:
    import json
    import re

    from tests.conftest import REPO

    dashboard = json.loads((REPO / "docker" / "grafana-factory.json").read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"factory_[a-z_]+", target["expr"])
    }
    metrics.segment_done("wan", "832x480", "H100", 1.0)
    metrics.qc_failed(["mobile.vmaf"])
    metrics.delivered(1)
    collector = metrics.ClusterCollector(lambda: {"done": 1}, lambda: {"gpu": 0}, lambda: 0.5)
    metrics.add_collector(collector)
    try:
        text = metrics.exposition()[0].decode()
    finally:
        metrics._extra.remove(collector)
    exported = set(re.findall(r"^(factory_[a-z_]+)", text, re.M))
    assert queried and queried <= exported, queried - exported
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
