"""`factory worker --gpus auto`: one GPU worker per GPU of this node, each its own child
process (`factory worker --gpu N`, its own queue), supervised from here.

A child that dies is started again after a pause that doubles (1 s … 60 s) and resets once
it has run for ten minutes; if every child keeps dying at start (a configuration error),
the pool gives up with exit status 1 rather than loop. SIGTERM or SIGINT is passed on as
SIGTERM (Celery's warm shutdown: running segments finish); a second one as SIGQUIT (stop
now; the sweeper resumes what was running). The children run in their own process groups,
so a Ctrl-C reaches them once, through here, and they are told to stop if this process dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import signal
import subprocess
import time
from dataclasses import dataclass, field

log = logging.getLogger("factory.gpu_pool")  # its name before issue 36

FIRST_PAUSE = 1.0
LONGEST_PAUSE = 60.0
STABLE_AFTER = 600.0  # a child that ran this long starts again without delay
QUICK_DEATH = 10.0  # dying sooner than this after start counts toward giving up
GIVE_UP_AFTER = 5  # consecutive quick deaths of every child


@dataclass
class Child:
    gpu: int
    argv: list[str]
    process: subprocess.Popen | None = None
    started: float = 0.0
    pause: float = FIRST_PAUSE
    start_at: float = 0.0
    quick_deaths: int = 0
    exits: list[int] = field(default_factory=list)


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the pool's process dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class GpuPool:
    def __init__(
        self,
        children: list[Child],
        first_pause: float = FIRST_PAUSE,
    ) -> None:
        self.children = children
        for child in children:
            child.pause = first_pause
        self.first_pause = first_pause
        self.stopping = 0  # signals received

    def _start(self, child: Child) -> None:
        child.process = subprocess.Popen(
            child.argv,
            process_group=0,
            preexec_fn=_die_with_parent,  # safe here: the pool starts no threads
        )
        child.started = time.monotonic()
        log.info("gpu_pool.started gpu=%s pid=%s", child.gpu, child.process.pid)

    def _signal(self, signum: int, _frame: object) -> None:
        self.stopping += 1
        forward = signal.SIGTERM if self.stopping == 1 else signal.SIGQUIT
        log.info("gpu_pool.stopping signal=%s, passed on as %s", signum, forward.name)
        for child in self.children:
            if child.process is not None and child.process.poll() is None:
                child.process.send_signal(forward)

    def run(self, poll: float = 0.5) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._signal)
        for child in self.children:
            self._start(child)
        while True:
            now = time.monotonic()
            running = 0
            for child in self.children:
                if child.process is not None and child.process.poll() is None:
                    running += 1
                    if now - child.started >= QUICK_DEATH:
                        child.quick_deaths = 0
                    continue
                if self.stopping:
                    continue
                if child.process is not None:
                    self._exited(child, now)
                if now >= child.start_at:
                    self._start(child)
                    running += 1
            if self.stopping and running == 0:
                return 0
            if all(c.quick_deaths >= GIVE_UP_AFTER for c in self.children):
                exits = {c.gpu: c.exits[-GIVE_UP_AFTER:] for c in self.children}
                log.error("gpu_pool.giving_up: every worker keeps dying at start, exits %s", exits)
                self._signal(signal.SIGTERM, None)
                for child in self.children:
                    if child.process is not None:
                        child.process.wait()
                return 1
            time.sleep(poll)

    def _exited(self, child: Child, now: float) -> None:
        assert child.process is not None
        code = child.process.returncode
        child.exits.append(code)
        lived = now - child.started
        child.quick_deaths = child.quick_deaths + 1 if lived < QUICK_DEATH else 0
        if lived >= STABLE_AFTER:
            child.pause = self.first_pause
        child.start_at = now + child.pause
        log.warning(
            "gpu_pool.child_exited gpu=%s status=%s after %.1f s; starting it again in %.0f s",
            child.gpu, code, lived, child.pause,
        )  # fmt: skip
        child.pause = min(child.pause * 2, LONGEST_PAUSE)
        child.process = None
