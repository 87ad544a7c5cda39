"""Control-plane benchmark: how many segment tasks and checkpoints per second one Redis and one
PostgreSQL carry, for planning past one machine (docs/operations.md, "Capacity").

    python bench/control_plane.py [--workers N] [--jobs 24] [--segments 40] [--sweep-jobs 10000]

Real `factory worker --gpu N` processes (as many as the machine holds: 2 per core by
default) on the machine's Redis and a throwaway PostgreSQL database, each making segments
that take no time (the `timed` generator at 0.1 ms, 64x64 frames), so that everything left is
the factory's own path: dispatch, claim, stitch, storing the segment, checkpoint; a task per
segment (FACTORY_GPU_TASK_SECONDS=0), so that every segment crosses the broker and a claim.

Reported, all measured in this run:
- segments per second sustained (first claim to last checkpoint), per worker and in all;
- dispatch latency (a segment recorded -> the next one claimed by its worker, from the
  events) and checkpoint latency (a probe recording segments of its own job through the
  state machine while the workers run) p50 / p99, and the same probe on an idle system;
- CPU seconds that PostgreSQL (all its processes) and Redis spent per segment, and the
  PostgreSQL connections the workers held;
- the sweeper's query with 10,000 jobs in the table: nothing stale (every 30 s), and 100
  stale jobs among them (a crash).
From these the capacity in GPUs at one segment per GPU every 1.5 s (real-time-class models).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import psycopg2

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.orchestration import manifest  # noqa: E402
from factory.db import migrate  # noqa: E402
from factory.db.session import Database  # noqa: E402
from factory.db.state import JobStateMachine  # noqa: E402
from factory.job import SegmentRecord  # noqa: E402
from factory.manifest import parse_manifest  # noqa: E402
from factory.ops.submit import submit  # noqa: E402
from factory.stages import Stage  # noqa: E402
from tests.integration.cluster import BROKER, new_cluster  # noqa: E402

PG_ADMIN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
SEGMENT_EVERY_S = 1.5  # a real-time-class model on one GPU (docs/models.md)


def cpu_seconds(pattern: str) -> float:
    """utime + stime of every live process whose command matches (PostgreSQL: all its
    backends; the workers keep theirs open for the whole run)."""
    pids = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Probe:
    """Records segments of a job of its own through the state machine, timing each."""

    def __init__(self, database: Database) -> None:
        self.machine = JobStateMachine(database)
        text = "batch: probe\nvideos:\n  - {id: p, duration: 600, fps: 30, resolution: 64x64, " \
               "segment: {frames: 8, overlap: 2}, prompt: probe}\n"  # fmt: skip
        job = submit(parse_manifest(text), self.machine, None).jobs[0]
        job = self.machine.claim(job.job_id, seen_attempt=job.attempt, worker="probe")
        self.job = self.machine.transition(job.job_id, attempt=job.attempt, to=Stage.GENERATE)
        self.index = 0
        self.times: list[float] = []
        self.stop = threading.Event()

    def once(self) -> None:
        colour = {"mean": [120.0, 118.5, 101.2], "spread": 41.3, "lab": [49.1, 2.2, 9.8]}
        record = SegmentRecord(self.index, self.job.attempt, 1.5, colour, None, None)
        started = time.perf_counter()
        self.job = self.machine.record_segment(
            self.job.job_id, attempt=self.job.attempt, record=record,
            updates={"frame": self.index * 6}, detail={"segment": self.index},
        )  # fmt: skip
        self.times.append(time.perf_counter() - started)
        self.index += 1

    def run(self, every: float) -> None:
        while not self.stop.wait(every):
            self.once()


def dispatch_latencies(machine: JobStateMachine, job_ids: list[str]) -> list[float]:
    found = []
    for job_id in job_ids:
        last_done = None
        for event in machine.events(job_id):
            if event.event == "segment.done":
                last_done = event.at
            elif event.event == "claimed" and last_done is not None:
                found.append((event.at - last_done).total_seconds())
                last_done = None
    return found


def sweeper_times(database: Database, jobs: int, repeats: int = 20) -> tuple[float, float]:
    """The sweep with `jobs` jobs in the table: none stale, then 100 stale (claimed and put
    back each time, so every sweep finds the same 100)."""
    machine = JobStateMachine(database)
    base = parse_manifest(
        "batch: sweep\nvideos:\n  - {id: v, duration: 10, fps: 8, resolution: 64x64, prompt: x}\n"
    ).videos[0]
    for start in range(0, jobs, 1000):
        specs = [replace(base, video_id=f"v{i:05d}") for i in range(start, min(jobs, start + 1000))]
        with database.transaction() as conn:
            machine.create(conn, "bench", specs)
    engine = database.engine
    with engine.begin() as conn:  # most jobs generating and beating, like a busy night
        conn.exec_driver_sql(
            "UPDATE jobs SET stage = 'generate', heartbeat_at = clock_timestamp() "
            "WHERE batch = 'sweep'"
        )
    idle = []
    for _ in range(repeats):
        started = time.perf_counter()
        machine.claim_stale(stale_after=300, waiting=list, max_recoveries=99, worker="bench")
        idle.append(time.perf_counter() - started)
    stale = []
    old = machine.current_time() - timedelta(hours=1)
    for _ in range(repeats):
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "UPDATE jobs SET heartbeat_at = %(old)s, claimed_by = NULL WHERE job_id IN "
                "(SELECT job_id FROM jobs WHERE batch = 'sweep' ORDER BY job_id LIMIT 100)",
                {"old": old},
            )
        started = time.perf_counter()
        claimed, _ = machine.claim_stale(
            stale_after=300, waiting=list, max_recoveries=99, worker="bench"
        )
        stale.append(time.perf_counter() - started)
        assert len(claimed) == 100, len(claimed)
    return statistics.median(idle) * 1000, statistics.median(stale) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2 * (os.cpu_count() or 1))
    parser.add_argument("--jobs", type=int, default=24)
    parser.add_argument("--segments", type=int, default=40)
    parser.add_argument("--sweep-jobs", type=int, default=10_000)
    args = parser.parse_args()
    name = f"factory_bench_{uuid.uuid4().hex[:8]}"
    url = f"postgresql+psycopg2://postgres@127.0.0.1/{name}"
    admin = psycopg2.connect(PG_ADMIN)
    admin.autocommit = True
    admin.cursor().execute(f'CREATE DATABASE "{name}"')
    try:
        database = Database(url)
        migrate.upgrade(database)
        probe = Probe(database)
        for _ in range(200):
            probe.once()
        idle_probe = probe.times[50:]
        probe.times = []
        with tempfile.TemporaryDirectory() as tmp:
            cluster = new_cluster(Path(tmp), url)
            # A task per segment (FACTORY_GPU_TASK_SECONDS=0): every segment goes through the
            # broker and a claim, the most the control plane can be asked to carry; with the
            # default (60 s) a GPU dispatches and claims once a minute, and checkpoints only.
            cluster.env_overrides = {"FACTORY_STALE_AFTER": "600", "FACTORY_STORE_FSYNC": "0",
                                     "FACTORY_GPU_TASK_SECONDS": "0"}  # fmt: skip
            try:
                machine = cluster.factory().jobs
                machine.get(probe.job.job_id)  # the bench's own connection, opened now
                with admin.cursor() as cur:
                    cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                                (name,))  # fmt: skip
                    own = cur.fetchone()[0]
                cluster.start_workers(gpus=args.workers, cpu=False, beat=False)
                path = manifest(
                    Path(tmp) / "m.yaml", args.jobs, args.segments, 0.0001, batch="plane"
                )
                pg_before, redis_before = cpu_seconds("postgres"), cpu_seconds("redis-server")
                ids = cluster.submit(path)
                threading.Thread(target=probe.run, args=(0.1,), daemon=True).start()
                connections = 0
                deadline = time.monotonic() + 1800
                while time.monotonic() < deadline:
                    with admin.cursor() as cur:
                        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                                    (name,))  # fmt: skip
                        connections = max(connections, cur.fetchone()[0] - own)
                    if all(machine.get(j).stage is not Stage.GENERATE and
                           machine.get(j).stage is not Stage.QUEUED for j in ids):  # fmt: skip
                        break
                    time.sleep(0.5)
                probe.stop.set()
                pg_used = cpu_seconds("postgres") - pg_before
                redis_used = cpu_seconds("redis-server") - redis_before
                stamps = [e.at for j in ids for e in machine.events(j)
                          if e.event in ("claimed", "segment.done")]  # fmt: skip
                made = sum(e.event == "segment.done" for j in ids for e in machine.events(j))
                dispatch = dispatch_latencies(machine, ids)
            finally:
                cluster.stop()
        busy_probe = probe.times
        sweep_idle, sweep_stale = sweeper_times(database, args.sweep_jobs)
        database.dispose()
    finally:
        admin.cursor().execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    span = (max(stamps) - min(stamps)).total_seconds()
    rate = made / span
    pg_per, redis_per = pg_used / made, redis_used / made
    print(f"\n{args.workers} GPU-queue workers on {os.cpu_count()} cores, {args.jobs} jobs x "
          f"{args.segments} segments that take no time; broker {BROKER}")  # fmt: skip
    print("\n| figure | value |\n|---|---|")
    print(f"| segments per second, sustained | {rate:.1f} ({rate / args.workers:.1f} per worker) |")
    print(f"| dispatch latency p50 / p99 | {statistics.median(dispatch) * 1000:.1f} / "
          f"{percentile(dispatch, 0.99) * 1000:.1f} ms |")  # fmt: skip
    print(f"| checkpoint latency under load p50 / p99 | {statistics.median(busy_probe) * 1000:.1f}"
          f" / {percentile(busy_probe, 0.99) * 1000:.1f} ms |")  # fmt: skip
    print(f"| checkpoint latency idle p50 / p99 | {statistics.median(idle_probe) * 1000:.1f} / "
          f"{percentile(idle_probe, 0.99) * 1000:.1f} ms |")  # fmt: skip
    print(f"| PostgreSQL CPU per segment | {pg_per * 1000:.2f} ms (the probe's "
          f"{len(busy_probe)} checkpoints included) |")  # fmt: skip
    print(f"| Redis CPU per segment | {redis_per * 1000:.2f} ms |")
    print(f"| PostgreSQL connections held by {args.workers} workers | {connections} |")
    print(f"| sweeper query, {args.sweep_jobs:,} jobs, none stale | {sweep_idle:.1f} ms |")
    print(f"| sweeper claim, {args.sweep_jobs:,} jobs, 100 stale | {sweep_stale:.1f} ms |")
    gpus_per_rate = SEGMENT_EVERY_S  # GPUs per segment/s
    print(f"\nAt one segment per GPU every {SEGMENT_EVERY_S} s:")
    print(f"- this machine's run: {rate * gpus_per_rate:.0f} GPUs' worth of segments per second")
    print(f"- PostgreSQL, per core it is given: {1 / pg_per * gpus_per_rate:.0f} GPUs")
    print(f"- Redis (one core): {1 / redis_per * gpus_per_rate:.0f} GPUs")
    per_worker = connections / args.workers
    print(f"- connections: {per_worker:.1f} per GPU worker -> max_connections 100 holds "
          f"{int(97 / per_worker)} GPU workers")  # fmt: skip


if __name__ == "__main__":
    main()
