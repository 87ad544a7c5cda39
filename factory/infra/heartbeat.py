"""A heartbeat thread: while a worker works on a job, `heartbeat_at` keeps moving, so the
sweeper knows the job is alive.

The beat is also how a holder learns that it must stop, and it stops the work at once (the
``StopSignal`` of ``factory.infra.stopping``, checked between steps):

- the job was taken away (cancelled, requeued, recovered by the sweeper): the beat's fenced
  write finds zero rows;
- the beat could not be written for half of FACTORY_STALE_AFTER, whatever the error (the
  database away, a read-only transaction during a failover): past the stale threshold the
  sweeper would give the job to another worker, so this one stops first and leaves the job
  to it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType

from factory.db.state import JobStateMachine
from factory.errors import StaleAttempt
from factory.infra import stopping
from factory.infra.redact import redact

log = logging.getLogger("factory.heartbeat")  # its name before issue 36


class Heartbeat:
    def __init__(
        self,
        machine: JobStateMachine,
        job_id: str,
        attempt: int,
        every: float,
        *,
        stale_after: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,  # the tests drive it
    ) -> None:
        self.machine, self.job_id, self.attempt, self.every = machine, job_id, attempt, every
        self.give_up_after = (stale_after if stale_after is not None else 10 * every) / 2
        self.signal = stopping.StopSignal(job_id, attempt)
        self._monotonic = monotonic
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{job_id}", daemon=True)
        self._watch = stopping.watching(self.signal)

    @property
    def lost(self) -> str | None:
        """Why the holder must stop, once it must."""
        return self.signal.reason

    def beat_once(self, failing_since: float | None) -> float | None:
        """One beat; returns when the beats started failing (None while they succeed)."""
        try:
            self.machine.heartbeat(self.job_id, attempt=self.attempt)
        except StaleAttempt as exc:
            log.warning("heartbeat.lost", extra={"job_id": self.job_id, "reason": exc.reason})
            self.signal.stop(exc.reason)
            return failing_since
        except Exception as exc:  # any failure: a driver error must not end the beat silently
            now = self._monotonic()
            since = failing_since if failing_since is not None else now
            error = redact(f"{type(exc).__name__}: {exc}".splitlines()[0])[:300]
            log.warning("heartbeat.failed", extra={"job_id": self.job_id, "error": error,
                                                   "failing_s": round(now - since, 1)})  # fmt: skip
            if now - since >= self.give_up_after:
                self.signal.stop(
                    f"the heartbeat could not be written for {now - since:.0f} s (half of "
                    f"FACTORY_STALE_AFTER): {error}; the sweeper gives the job to another worker"
                )
            return since
        return None

    def _run(self) -> None:
        failing_since: float | None = None
        while not self._stop.wait(self.every):
            failing_since = self.beat_once(failing_since)
            if self.signal.stopped:
                return

    def __enter__(self) -> Heartbeat:
        self._watch.__enter__()
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=self.every + 5)
        self._watch.__exit__(kind, exc, tb)
