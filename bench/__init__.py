"""Benchmarks (docs/benchmarks.md); what several of them share."""

from __future__ import annotations

import time
from collections.abc import Callable


def least(runs: int, work: Callable[[], object], clock: Callable[[], float] = time.perf_counter
          ) -> float:  # fmt: skip
    """The least time `work` takes over `runs` runs, by `clock` (wall time unless told)."""
    best = float("inf")
    for _ in range(runs):
        started = clock()
        work()
        best = min(best, clock() - started)
    return best
