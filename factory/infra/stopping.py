"""Stopping the work of a job at once when its holder loses it.

The heartbeat thread learns first that a job was taken away (cancelled, requeued, recovered
by the sweeper) or that the database cannot be written. It sets the holder's ``StopSignal``;
the work checks it between steps (each denoising step, each ffmpeg poll, before each store
write), so a superseded worker stops within a step instead of finishing its segment.

The signal travels in a context variable, so code that cannot be handed it (a generator
backend, the ffmpeg runner) still finds it: ``check()`` and ``sleep()``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from factory.errors import StaleAttempt


class StopSignal:
    def __init__(self, job_id: str, attempt: int) -> None:
        self.job_id, self.attempt = job_id, attempt
        self.reason: str | None = None
        self.event = threading.Event()

    def stop(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self.event.set()

    @property
    def stopped(self) -> bool:
        return self.event.is_set()

    def check(self) -> None:
        """Raise ``StaleAttempt`` if the holder must stop."""
        if self.event.is_set():
            raise StaleAttempt(self.job_id, self.attempt, self.reason or "stopped")


_current: ContextVar[StopSignal | None] = ContextVar("factory_stop", default=None)


@contextmanager
def watching(signal: StopSignal) -> Iterator[StopSignal]:
    token = _current.set(signal)
    try:
        yield signal
    finally:
        _current.reset(token)


def current() -> StopSignal | None:
    return _current.get()


def check() -> None:
    signal = _current.get()
    if signal is not None:
        signal.check()


def sleep(seconds: float) -> None:
    """``time.sleep`` that ends early (raising ``StaleAttempt``) when the holder must stop."""
    signal = _current.get()
    if signal is None:
        threading.Event().wait(seconds)
        return
    signal.event.wait(seconds)
    signal.check()
