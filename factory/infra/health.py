"""A worker's health over HTTP, for Kubernetes probes and load balancers:

- `GET /livez`: 200 while the process runs and its broker answers; 503 otherwise.
- `GET /readyz`: 200 while the GPU's memory in use is below FACTORY_READY_GPU_MEMORY (95 %);
  503 above it. Above it the worker also stops consuming its queues, so no new segment lands
  on a card about to run out of memory; it resumes once usage falls 5 points below.
- `GET /metrics`: Prometheus metrics (factory/infra/metrics.py); with a token set
  (FACTORY_METRICS_TOKEN), only for `Authorization: Bearer <token>`, 401 otherwise.

At most `max_requests` requests are handled at once, each in its own thread and cut off
after `timeout` seconds; beyond that the accepting thread answers 503 itself, so a flood of
connections costs no thread and no database connection (the settings:
factory/infra/health_settings.py).

Nothing here knows Celery: the worker passes in how to check its broker and how to pause and
resume its queues (tasks/health.py).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from factory.gpu.memory import MemoryReading, MemorySource
from factory.infra.redact import redact

log = logging.getLogger("factory.health")
HYSTERESIS = 0.05
RETRY_AFTER = 1  # seconds, in a 503 for too many requests at once
_BUSY_BODY = b'{"error": "too many requests at once; retry shortly"}'
BUSY = (
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: %d\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
    % (RETRY_AFTER, len(_BUSY_BODY), _BUSY_BODY)
)
LINGER = 1.0  # seconds a refused connection stays half-open, so the client reads its 503
MAX_LINGERING = 256


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
        *,
        max_requests: int = 8,
        timeout: float = 5.0,
        metrics_token: str | None = None,
    ) -> None:
        handler = _handler(readiness, alive, metrics, metrics_token, timeout)
        self.server = _BoundedServer((host, port), handler, max_requests, timeout)
        self.port = self.server.server_address[1]

    def start(self) -> HealthServer:
        threading.Thread(target=self.server.serve_forever, name="health", daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _BoundedServer(ThreadingHTTPServer):
    """A thread per request, at most `slots` at once, each for at most `timeout` seconds."""

    daemon_threads = True
    request_queue_size = 128  # a burst waits in the backlog for its 503, not in SYN retries

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        slots: int,
        timeout: float,
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._slots = threading.BoundedSemaphore(slots)
        self._timeout = timeout
        self._lock = threading.Lock()
        self._active: dict[socket.socket, float] = {}  # request -> when it is cut off
        self._lingering: deque[tuple[float, socket.socket]] = deque()
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self._refuse(request)
            return
        with self._lock:
            self._active[request] = time.monotonic() + self._timeout
        try:
            super().process_request(request, client_address)  # starts the request's thread
        except BaseException:
            self._done(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self._done(request)

    def _done(self, request: socket.socket) -> None:
        with self._lock:  # so that service_actions never shuts a socket being closed
            self._active.pop(request, None)
            self.shutdown_request(request)
        self._slots.release()

    def _refuse(self, request: socket.socket) -> None:
        """503 from the accepting thread: never blocks, never starts a thread."""
        try:
            request.setblocking(False)
            _drain(request)
            request.sendall(BUSY)  # a fresh socket's send buffer takes it whole
            # Half-close and keep it a moment: closed at once with the request still unread
            # (or still arriving), the socket would answer with a reset the client may see
            # before it reads the 503.
            request.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(request)
            return
        self._lingering.append((time.monotonic() + LINGER, request))
        while len(self._lingering) > MAX_LINGERING:
            self._close(self._lingering.popleft()[1])

    def service_actions(self) -> None:
        """Between accepts (serve_forever's loop, at least every half second)."""
        now = time.monotonic()
        while self._lingering and self._lingering[0][0] <= now:
            self._close(self._lingering.popleft()[1])
        with self._lock:
            late = [request for request, deadline in self._active.items() if deadline <= now]
            for request in late:
                # A client too slow to send its request or read the answer: its thread's
                # blocked read or write fails now and gives the slot back.
                del self._active[request]
                with contextlib.suppress(OSError):
                    request.shutdown(socket.SHUT_RDWR)

    def server_close(self) -> None:
        super().server_close()
        while self._lingering:
            self._close(self._lingering.popleft()[1])

    def _close(self, request: socket.socket) -> None:
        with contextlib.suppress(OSError):
            _drain(request)
        request.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Not socketserver's traceback on stderr: a client that went away is routine.
        log.debug("health.request_failed", exc_info=True)


def _drain(request: socket.socket, limit: int = 1 << 16) -> None:
    """Read what the client has sent so far, without waiting (a non-blocking socket)."""
    while limit > 0:
        try:
            data = request.recv(min(limit, 8192))
        except (BlockingIOError, InterruptedError):
            return
        if not data:
            return
        limit -= len(data)


def _handler(
    readiness: Readiness,
    alive: Callable[[], str | None],
    metrics: Callable[[], tuple[bytes, str]] | None,
    token: str | None,
    request_timeout: float,
) -> type[BaseHTTPRequestHandler]:
    """A handler class bound to this worker's probes and its metrics token."""
    return type("Handler", (_Handler,), {
        "timeout": request_timeout,  # each read and write; the whole request: _BoundedServer
        "readiness": readiness,
        "alive": staticmethod(alive),
        "metrics": staticmethod(metrics) if metrics is not None else None,
        "expected": f"Bearer {token}".encode() if token else None,
    })  # fmt: skip


class _Handler(BaseHTTPRequestHandler):
    readiness: Readiness
    alive: Callable[[], str | None]
    metrics: Callable[[], tuple[bytes, str]] | None
    expected: bytes | None

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/livez":
            self._livez()
        elif path == "/readyz":
            self._readyz()
        elif path == "/metrics" and self.metrics is not None:
            self._metrics(self.metrics)
        else:
            self._json(404, {"error": "not found; try /livez, /readyz, /metrics"})

    def _livez(self) -> None:
        problem = self.alive()
        reason = redact(problem) if problem else "ok"
        self._json(200 if problem is None else 503, {"alive": problem is None, "reason": reason})

    def _readyz(self) -> None:
        readiness = self.readiness
        reading = readiness.last
        body: dict[str, Any] = {"ready": readiness.ready, "reason": readiness.reason}
        if reading is not None:
            body.update(used=reading.used, total=reading.total)
        self._json(200 if readiness.ready else 503, body)

    def _metrics(self, metrics: Callable[[], tuple[bytes, str]]) -> None:
        if self.expected is not None and not self._authorized(self.expected):
            self._json(401, {"error": "/metrics needs Authorization: Bearer <token>"},
                       {"WWW-Authenticate": 'Bearer realm="metrics"'})  # fmt: skip
            return
        try:
            data, content_type = metrics()
        except Exception as error:
            log.warning("health.metrics_failed", extra={"error": str(error)})
            self._json(500, {"error": "metrics unavailable; see the worker's log"})
            return
        self._send(200, data, content_type)

    def _authorized(self, expected: bytes) -> bool:
        given = (self.headers.get("Authorization") or "").strip().encode()
        return hmac.compare_digest(given, expected)

    def _json(
        self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        self._send(status, json.dumps(body).encode(), "application/json", headers)

    def _send(
        self,
        status: int,
        data: bytes,
        content_type: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # nothing per request (and never the headers, which may hold the token)
