"""The embedded server's own runner. Without a broker nothing else runs the work that
`factory serve` accepts (no workers, no sweeper), so its Operations dispatch to this: submit,
requeue, approve and redo all queue their jobs here, and one background thread runs them
(Operations.run_here) one at a time, in the order they were accepted (docs/console.md)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from factory.job import Job


class LocalRunner:
    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="factory-run")
        self._run: Callable[[str, str], Any] | None = None

    def start(self, run: Callable[[str, str], Any]) -> None:
        """`run(job_id, actor)` runs a job's remaining stages (Operations.run_here)."""
        self._run = run

    def dispatch(self, found: list[Job]) -> None:
        """An Operations dispatcher: queue the jobs and return at once."""
        if self._run is None:
            raise RuntimeError("the runner was not started")
        for job in found:
            self._pool.submit(self._one, job.job_id)

    def close(self) -> None:
        """Stop taking jobs: what is queued stays in its stage (`requeue` sends it again);
        the job being run finishes before the process exits."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _one(self, job_id: str) -> None:
        assert self._run is not None
        # run_here logs what went wrong (run_job records the job's own failures in the job),
        # and the next job is run all the same
        with contextlib.suppress(Exception):
            self._run(job_id, "serve")
