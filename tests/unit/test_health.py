"""Readiness by GPU memory (with hysteresis), the health endpoints over real HTTP, and the
metrics text, with a file standing in for NVML; the endpoint's limits (requests at once, a
slow client's timeout, the metrics token), the metrics cache, and the settings."""

from __future__ import annotations

import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from factory.config import Settings
from factory.config import health as health_settings
from factory.config.health import HealthSettings
from factory.errors import ConfigError
from factory.gpu.memory import FileMemory, NoMemory, open_memory_source
from factory.infra import metrics
from factory.infra.health import HealthServer, Readiness


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


def _server(metrics_fn=metrics.exposition, **options) -> HealthServer:
    readiness = Readiness(NoMemory(), 0.95)
    return HealthServer(0, readiness, lambda: None, metrics_fn, host="127.0.0.1",
                        **options).start()  # fmt: skip


def test_beyond_max_requests_at_once_the_server_answers_503_at_once() -> None:
    entered, release = threading.Semaphore(0), threading.Event()

    def slow_metrics() -> tuple[bytes, str]:
        entered.release()
        release.wait(30)
        return b"factory_x 1\n", "text/plain"

    server = _server(slow_metrics, max_requests=2, timeout=30)
    base = f"http://127.0.0.1:{server.port}"
    try:
        with ThreadPoolExecutor(2) as pool:
            slow = [pool.submit(requests.get, f"{base}/metrics", timeout=30) for _ in range(2)]
            for _ in range(2):
                assert entered.acquire(timeout=30), "the slow requests never started"
            for path in ("/metrics", "/livez", "/readyz"):  # every slot is taken
                busy = requests.get(f"{base}{path}", timeout=30)
                assert busy.status_code == 503, path
                assert busy.headers["Retry-After"] == "1"
                assert "too many requests" in busy.json()["error"]
            release.set()
            assert [f.result().status_code for f in slow] == [200, 200]
        # the slots are given back: a thread's slot is released after its answer is sent
        wait_until(lambda: requests.get(f"{base}/livez", timeout=30).status_code == 200)
    finally:
        release.set()
        server.stop()


def test_a_client_that_sends_nothing_loses_its_slot_after_the_timeout() -> None:
    server = _server(max_requests=1, timeout=0.5)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as idle:
            # the idle client holds the only slot until the server cuts it off
            wait_until(lambda: _get(server, "/livez") == 200)
            assert idle.recv(1024) == b""  # closed by the server, nothing sent
    finally:
        server.stop()


def test_metrics_need_the_bearer_token_when_one_is_set() -> None:
    token = "s3cret-metrics-token-0123456789"
    server = _server(metrics_token=token)
    base = f"http://127.0.0.1:{server.port}"
    try:
        for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"},
                        {"Authorization": f"Basic {token}"},
                        {"Authorization": f"Bearer {token}x"}):  # fmt: skip
            denied = requests.get(f"{base}/metrics", headers=headers, timeout=30)
            assert denied.status_code == 401, headers
            assert denied.headers["WWW-Authenticate"].startswith("Bearer")
            assert token not in denied.text and "factory_" not in denied.text
        allowed = requests.get(
            f"{base}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30
        )
        assert allowed.status_code == 200 and "factory_delivered_bytes_total" in allowed.text
        for path in ("/livez", "/readyz"):  # probes carry no token
            assert requests.get(f"{base}{path}", timeout=30).status_code == 200
    finally:
        server.stop()


def test_a_failing_metrics_read_is_a_500_without_its_details() -> None:
    def broken() -> tuple[bytes, str]:
        raise RuntimeError("connection to postgresql://factory:hunter2@db failed")

    server = _server(broken)
    try:
        answer = requests.get(f"http://127.0.0.1:{server.port}/metrics", timeout=30)
        assert answer.status_code == 500 and "hunter2" not in answer.text
        assert requests.get(f"http://127.0.0.1:{server.port}/livez", timeout=30).ok
    finally:
        server.stop()


def test_the_cache_makes_one_read_for_a_burst_and_keeps_a_failure_for_its_period() -> None:
    now = [0.0]
    started, release = threading.Event(), threading.Event()
    reads: list[int] = []

    def read() -> dict[str, int]:
        reads.append(1)
        started.set()
        release.wait(30)
        if len(reads) == 2:
            raise RuntimeError("database unavailable")
        return {"done": len(reads)}

    cached = metrics.Cached(read, 5.0, clock=lambda: now[0])
    with ThreadPoolExecutor(20) as pool:
        first = [pool.submit(cached.get) for _ in range(20)]
        assert started.wait(30)
        release.set()
        assert [f.result() for f in first] == [{"done": 1}] * 20  # all waited for the one read
    assert len(reads) == 1
    now[0] = 4.9
    assert cached.get() == {"done": 1} and len(reads) == 1
    now[0] = 5.0
    assert cached.get() is None and len(reads) == 2  # the failed refill
    now[0] = 9.9
    assert cached.get() is None and len(reads) == 2  # not asked again so soon
    now[0] = 10.0
    assert cached.get() == {"done": 3} and len(reads) == 3


def test_while_one_scrape_refills_the_others_get_the_previous_value() -> None:
    now, release, reads = [0.0], threading.Event(), []

    def read() -> int:
        reads.append(1)
        if len(reads) == 2:
            release.wait(30)
        return len(reads)

    cached = metrics.Cached(read, 5.0, clock=lambda: now[0])
    assert cached.get() == 1
    now[0] = 6.0
    with ThreadPoolExecutor(1) as pool:
        refill = pool.submit(cached.get)
        wait_until(lambda: len(reads) == 2)
        assert [cached.get() for _ in range(10)] == [1] * 10  # not waiting, not reading
        release.set()
        assert refill.result() == 2
    assert cached.get() == 2 and len(reads) == 2


def test_the_collector_leaves_out_a_family_whose_read_failed() -> None:
    def broken() -> dict[str, int]:
        raise RuntimeError("no database")

    collector = metrics.ClusterCollector(broken, lambda: {"gpu": 3}, cache=5.0)
    names = [family.name for family in collector.collect()]
    assert names == ["factory_queue_depth"]


def test_a_forked_child_never_uses_the_parents_metrics_connection(tmp_path: Path) -> None:
    engine = metrics.metrics_engine(f"sqlite:///{tmp_path / 'metrics.db'}")
    with engine.connect() as conn:
        parents = conn.connection.dbapi_connection
    pid = os.fork()
    if pid == 0:  # the child: a connection of its own, the parent's left alone
        try:
            with engine.connect() as conn:
                own = conn.connection.dbapi_connection is not parents
                os._exit(0 if own and conn.exec_driver_sql("SELECT 1").scalar() == 1 else 1)
        except BaseException:
            os._exit(2)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    with engine.connect() as conn:
        assert conn.connection.dbapi_connection is parents
        assert conn.exec_driver_sql("SELECT 1").scalar() == 1
    engine.dispose()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("FACTORY_HEALTH_HOST", "not a host"),
        ("FACTORY_HEALTH_HOST", "http://0.0.0.0"),
        ("FACTORY_HEALTH_PORT", "70000"),
        ("FACTORY_HEALTH_PORT", "-1"),
        ("FACTORY_HEALTH_MAX_REQUESTS", "0"),
        ("FACTORY_HEALTH_MAX_REQUESTS", "eight"),
        ("FACTORY_HEALTH_MAX_REQUESTS", "2.5"),
        ("FACTORY_HEALTH_TIMEOUT", "-1"),
        ("FACTORY_HEALTH_TIMEOUT", "nan"),
        ("FACTORY_METRICS_CACHE", "0"),
        ("FACTORY_METRICS_CACHE", "inf"),
        ("FACTORY_METRICS_TOKEN", "short"),
        ("FACTORY_METRICS_TOKEN", "has a space in it 0123456789"),
    ],
)
def test_bad_health_settings_name_their_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as raised:
        health_settings.parse({name: value})
    assert raised.value.field == name and name in str(raised.value)
    if name == "FACTORY_METRICS_TOKEN":
        assert value not in str(raised.value)  # a rejected token is not printed either
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({"FACTORY_HOME": "/nonexistent", name: value})
    assert raised.value.field == name


def test_health_settings_defaults_and_values() -> None:
    assert Settings.from_env({"FACTORY_HOME": "/nonexistent"}).health == HealthSettings(
        port=None, host="0.0.0.0", max_requests=8, timeout=5.0, metrics_cache=5.0
    )
    token = "t0ken-for-the-metrics-endpoint"
    parsed = health_settings.parse({"FACTORY_HEALTH_PORT": "9100", "FACTORY_HEALTH_HOST": "::",
                                    "FACTORY_HEALTH_MAX_REQUESTS": "3",
                                    "FACTORY_HEALTH_TIMEOUT": "2.5",
                                    "FACTORY_METRICS_CACHE": "15",
                                    "FACTORY_METRICS_TOKEN": token})  # fmt: skip
    assert (parsed.port, parsed.host, parsed.max_requests) == (9100, "::", 3)
    assert (parsed.timeout, parsed.metrics_cache, parsed.metrics_token) == (2.5, 15.0, token)
    assert token not in repr(parsed)  # settings get logged; the token must not be
    assert health_settings.parse({"FACTORY_HEALTH_PORT": "0"}).port == 0  # any free port


def _get(server: HealthServer, path: str) -> int:
    return requests.get(f"http://127.0.0.1:{server.port}{path}", timeout=30).status_code


def wait_until(check, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
