"""Orchestration benchmark: real Celery workers on Redis and PostgreSQL, `timed` segments.

    python bench/orchestration.py [--seconds-per-segment 2.0] [--jobs 8] [--segments 30]

1. batch makespan / ideal: 8 jobs x 30 segments on 4 GPU-queue workers; ideal is
   jobs x segments x seconds-per-segment / workers (target <= 1.02). Measured from the
   submit to the last segment generated (the GPU part; the CPU stages follow);
2. per-segment overhead: for every segment, (task time - generation time) + (the gap since
   the same worker finished its previous segment): dispatch + claim + stitch + storing the
   segment and its tail + checkpoint. p50 and p99 (target p50 <= 25 ms; a Celery no-op
   round trip here is about 3 ms).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path

import psycopg2

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.integration.cluster import Cluster, new_cluster  # noqa: E402

PG_ADMIN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"


def manifest(path: Path, jobs: int, segments: int, seconds: float) -> Path:
    frames = 8 + (segments - 1) * 6  # segments of 8 frames, overlap 2
    lines = [
        "batch: orch",
        "defaults:",
        f"  duration: {frames / 8}",
        "  fps: 8",
        "  resolution: 64x64",
        "  segment: {frames: 8, overlap: 2}",
        "  renditions: [compat]",
        f"  model: {{family: timed, seconds_per_segment: {seconds}}}",
        "videos:",
    ]
    lines += [f"  - {{id: j{i}, prompt: 'job {i}'}}" for i in range(jobs)]
    path.write_text("\n".join(lines) + "\n")
    return path


def overheads(cluster: Cluster, job_ids: list[str], seconds: float) -> list[float]:
    machine = cluster.factory().jobs
    by_worker: dict[str, list[tuple[float, str, float]]] = defaultdict(list)
    for job_id in job_ids:
        events = machine.events(job_id)
        claim_at = None
        for e in events:
            if e.event == "claimed" and "gpu" in e.detail["worker"]:
                claim_at, worker = e.at.timestamp(), e.detail["worker"]
            elif e.event == "segment.done" and claim_at is not None:
                by_worker[worker].append((claim_at, "claim", 0.0))
                by_worker[worker].append((e.at.timestamp(), "done", e.at.timestamp() - claim_at))
                claim_at = None
    result = []
    for timeline in by_worker.values():
        timeline.sort()
        last_done = None
        for at, kind, task_time in timeline:
            if kind == "claim":
                gap = at - last_done if last_done is not None else 0.0
            else:
                result.append(task_time - seconds + gap)
                last_done = at
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds-per-segment", type=float, default=2.0)
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--segments", type=int, default=30)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    name = f"factory_bench_{uuid.uuid4().hex[:8]}"
    admin = psycopg2.connect(PG_ADMIN)
    admin.autocommit = True
    admin.cursor().execute(f'CREATE DATABASE "{name}"')
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cluster = new_cluster(Path(tmp), f"postgresql+psycopg2://postgres@127.0.0.1/{name}")
            cluster.env_overrides = {"FACTORY_STALE_AFTER": "600"}
            try:
                cluster.start_workers(gpus=args.workers, cpu=True, beat=False)
                path = manifest(
                    Path(tmp) / "m.yaml", args.jobs, args.segments, args.seconds_per_segment
                )
                started = time.time()
                ids = cluster.submit(path)
                jobs = cluster.wait_done(ids, timeout=3600)
                finished = time.time()
                machine = cluster.factory().jobs
                last_segment = max(
                    e.at.timestamp()
                    for j in ids
                    for e in machine.events(j)
                    if e.event == "segment.done"
                )
                over = sorted(overheads(cluster, ids, args.seconds_per_segment))
            finally:
                cluster.stop()
    finally:
        admin.cursor().execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    assert all(j.stage.value == "done" for j in jobs)
    ideal = args.jobs * args.segments * args.seconds_per_segment / args.workers
    makespan = last_segment - started
    p50 = statistics.median(over) * 1000
    p99 = over[min(len(over) - 1, int(0.99 * len(over)))] * 1000
    print(
        f"\n{args.jobs} jobs x {args.segments} segments x {args.seconds_per_segment} s on "
        f"{args.workers} GPU-queue workers"
    )
    print("\n| figure | value | target |\n|---|---|---|")
    print(f"| makespan (generation) / ideal | {makespan / ideal:.3f} | <= 1.02 |")
    print(f"| per-segment overhead p50 | {p50:.1f} ms | <= 25 ms |")
    print(f"| per-segment overhead p99 | {p99:.1f} ms | |")
    print(
        f"\nideal {ideal:.1f} s, generation makespan {makespan:.1f} s, whole batch "
        f"{finished - started:.1f} s (CPU stages included), {len(over)} segments measured"
    )


if __name__ == "__main__":
    main()
