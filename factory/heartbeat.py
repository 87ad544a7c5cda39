"""A heartbeat thread: while a worker works on a job, `heartbeat_at` keeps moving, so the
sweeper knows the job is alive. If the job is taken away (cancelled, requeued, recovered
by the sweeper), the beat notices and ``lost`` tells the worker to stop at its next check."""

from __future__ import annotations

import logging
import threading
from types import TracebackType

from factory.db.state import JobStateMachine
from factory.errors import FactoryError, StaleAttempt

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(self, machine: JobStateMachine, job_id: str, attempt: int, every: float) -> None:
        self.machine, self.job_id, self.attempt, self.every = machine, job_id, attempt, every
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{job_id}", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.machine.heartbeat(self.job_id, attempt=self.attempt)
            except StaleAttempt as exc:
                self.lost = exc.reason
                log.warning("heartbeat.lost", extra={"job_id": self.job_id, "reason": exc.reason})
                return
            except FactoryError as exc:  # the database is away: keep trying
                log.warning("heartbeat.failed", extra={"job_id": self.job_id, "error": str(exc)})

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=self.every + 5)
