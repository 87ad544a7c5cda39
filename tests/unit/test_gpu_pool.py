"""The GPU pool's supervision with real child processes: restarts with growing pauses, and
giving up when every child keeps dying at start (a configuration error, not a crash)."""

from __future__ import annotations

import sys
import threading
import time

from factory.gpu.pool import GIVE_UP_AFTER, Child, GpuPool


def test_gives_up_when_every_worker_dies_at_start():
    children = [Child(gpu, [sys.executable, "-c", "raise SystemExit(3)"]) for gpu in (0, 1)]
    started = time.monotonic()
    assert GpuPool(children, first_pause=0.01).run(poll=0.01) == 1
    for child in children:
        assert child.exits[-GIVE_UP_AFTER:] == [3] * GIVE_UP_AFTER
        # The pause doubled at each restart.
        assert child.pause == 0.01 * 2 ** len(child.exits)
    assert time.monotonic() - started < 30


def test_keeps_restarting_while_one_worker_stays_up(tmp_path):
    marker = tmp_path / "stop"
    lasting = Child(0, [sys.executable, "-c", f"""
import pathlib, time
while not pathlib.Path({str(marker)!r}).exists():
    time.sleep(0.05)
"""])  # fmt: skip
    dying = Child(1, [sys.executable, "-c", "raise SystemExit(5)"])
    pool = GpuPool([lasting, dying], first_pause=0.01)
    clock_start = time.monotonic()

    def stop_later() -> None:
        while len(dying.exits) < GIVE_UP_AFTER + 2 and time.monotonic() - clock_start < 60:
            time.sleep(0.05)
        marker.write_text("")  # the lasting one exits on its own: now both have died
        pool.stopping = 1

    threading.Thread(target=stop_later, daemon=True).start()
    assert pool.run(poll=0.01) == 0
    assert len(dying.exits) >= GIVE_UP_AFTER + 2, "one dying worker made the pool give up"
