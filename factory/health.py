"""A worker's health over HTTP, for Kubernetes probes and load balancers:

- `GET /livez`: 200 while the process runs and its broker answers; 503 otherwise.
- `GET /readyz`: 200 while the GPU's memory in use is below FACTORY_READY_GPU_MEMORY (95 %);
  503 above it. Above it the worker also stops consuming its queues, so no new segment lands
  on a card about to run out of memory; it resumes once usage falls 5 points below.
- `GET /metrics`: Prometheus metrics (factory/metrics.py).

Nothing here knows Celery: the worker passes in how to check its broker and how to pause and
resume its queues (tasks/health.py).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from factory.generate.gpu_memory import MemoryReading, MemorySource

log = logging.getLogger("factory.health")
HYSTERESIS = 0.05


@dataclass
class Readiness:
    """Decides, from memory readings, whether the worker should take new work."""

    source: MemorySource
    threshold: float = 0.95
    pause: Callable[[], None] = lambda: None
    resume: Callable[[], None] = lambda: None
    ready: bool = True
    last: MemoryReading | None = None
    reason: str = "no reading yet"
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def check(self) -> bool:
        reading = self.source.read()
        with self._lock:
            self.last = reading
            if reading is None:
                self.reason = f"no GPU memory reading from {self.source.name}: taking work"
                should = True
            elif self.ready:
                should = reading.fraction < self.threshold
            else:  # paused: resume only clearly below the threshold, not at every wobble
                should = reading.fraction < self.threshold - HYSTERESIS
            if reading is not None:
                self.reason = (f"GPU memory {reading.fraction:.1%} in use "
                               f"(limit {self.threshold:.0%}, {self.source.name})")  # fmt: skip
            changed, self.ready = should != self.ready, should
        if changed:
            log.warning("worker.readiness", extra={"ready": should, "reason": self.reason})
            (self.resume if should else self.pause)()
        return should


class Governor:
    """Checks readiness every `every` seconds in a daemon thread."""

    def __init__(self, readiness: Readiness, every: float = 2.0) -> None:
        self.readiness = readiness
        self.every = every
        self._stop = threading.Event()

    def start(self) -> Governor:
        threading.Thread(target=self._run, name="readiness", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.readiness.check()
            except Exception as error:  # a failed pause/resume: try again next time
                log.warning("worker.readiness_failed", extra={"error": str(error)})
            self._stop.wait(self.every)


class HealthServer:
    def __init__(
        self,
        port: int,
        readiness: Readiness,
        alive: Callable[[], str | None],  # None when alive, else why not
        metrics: Callable[[], tuple[bytes, str]] | None = None,
        host: str = "0.0.0.0",  # probes come from the node (kubelet), not from localhost
    ) -> None:
        handler = _handler(readiness, alive, metrics)
        self.server = ThreadingHTTPServer((host, port), handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]

    def start(self) -> HealthServer:
        threading.Thread(target=self.server.serve_forever, name="health", daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _handler(
    readiness: Readiness,
    alive: Callable[[], str | None],
    metrics: Callable[[], tuple[bytes, str]] | None,
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/livez":
                problem = alive()
                self._json(200 if problem is None else 503,
                           {"alive": problem is None, "reason": problem or "ok"})  # fmt: skip
            elif self.path == "/readyz":
                reading = readiness.last
                body: dict[str, Any] = {"ready": readiness.ready, "reason": readiness.reason}
                if reading is not None:
                    body.update(used=reading.used, total=reading.total)
                self._json(200 if readiness.ready else 503, body)
            elif self.path == "/metrics" and metrics is not None:
                data, content_type = metrics()
                self._send(200, data, content_type)
            else:
                self._json(404, {"error": f"no {self.path}; try /livez, /readyz, /metrics"})

        def _json(self, status: int, body: dict[str, Any]) -> None:
            self._send(status, json.dumps(body).encode(), "application/json")

        def _send(self, status: int, data: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
