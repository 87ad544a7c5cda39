"""The heartbeat handles every failure: the job taken away stops the work at once; a beat
that cannot be written (any error, a driver's InternalError included) stops it after half of
FACTORY_STALE_AFTER; a beat that recovers in time changes nothing."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy.exc import InternalError

from factory.errors import StaleAttempt
from factory.infra import stopping
from factory.infra.heartbeat import Heartbeat


class Beats:
    """Stands in for the state machine's heartbeat write: answers from a script."""

    def __init__(self, answers: list[Exception | None]) -> None:
        self.answers = answers
        self.calls = 0

    def heartbeat(self, job_id: str, *, attempt: int) -> None:
        self.calls += 1
        answer = self.answers.pop(0) if self.answers else None
        if answer is not None:
            raise answer


def read_only() -> InternalError:
    return InternalError("UPDATE jobs …", {}, Exception("cannot execute UPDATE in a read-only "
                                                       "transaction"))  # fmt: skip


def test_a_driver_error_is_survived_until_half_the_stale_threshold():
    now = {"t": 0.0}
    beat = Heartbeat(Beats([read_only()] * 10), "j", 3, 1.0, stale_after=10,
                     monotonic=lambda: now["t"])  # type: ignore[arg-type]  # fmt: skip
    since = None
    for second in range(5):
        now["t"] = float(second)
        since = beat.beat_once(since)
        assert not beat.signal.stopped, second
    now["t"] = 5.0
    beat.beat_once(since)
    assert beat.signal.stopped and "could not be written for 5 s" in (beat.lost or "")
    with pytest.raises(StaleAttempt):
        beat.signal.check()


def test_a_beat_that_recovers_in_time_starts_the_count_again():
    now = {"t": 0.0}
    answers: list[Exception | None] = [read_only(), read_only(), None, read_only(), read_only()]
    beat = Heartbeat(Beats(answers), "j", 3, 1.0, stale_after=6,
                     monotonic=lambda: now["t"])  # type: ignore[arg-type]  # fmt: skip
    since = None
    for second in range(5):
        now["t"] = float(second)
        since = beat.beat_once(since)
    assert not beat.signal.stopped


def test_losing_the_job_stops_the_work_at_once():
    beat = Heartbeat(Beats([StaleAttempt("j", 3, "the job was cancelled")]), "j", 3, 0.05,
                     stale_after=1)  # type: ignore[arg-type]  # fmt: skip
    started = time.monotonic()
    with pytest.raises(StaleAttempt) as stopped, beat:
        stopping.sleep(30)  # a long segment, as the timed generator makes it
    assert "cancelled" in stopped.value.reason
    assert time.monotonic() - started < 10


def test_the_stop_signal_belongs_to_the_thread_that_holds_the_job():
    beat = Heartbeat(Beats([]), "j", 3, 10, stale_after=60)  # type: ignore[arg-type]
    seen = {}
    with beat:
        thread = threading.Thread(target=lambda: seen.update(other=stopping.current()))
        thread.start()
        thread.join()
        assert stopping.current() is beat.signal
    assert seen["other"] is None and stopping.current() is None
