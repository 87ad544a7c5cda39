"""Orchestration benchmark: real Celery workers on Redis and PostgreSQL, `timed` segments.

    python bench/orchestration.py [--seconds-per-segment 2.0] [--jobs 8] [--segments 30]

Three runs, each on a throwaway PostgreSQL database and the machine's Redis:

- one video of 4 equal shots (joined by cuts, 15 segments each) on 4 GPU-queue workers:
  generation makespan / one shot's ideal time (target <= 1.1; one GPU at a time: 4). The
  ideal is the longest shot's own segments: a shot before a cut also makes its run-on
  (the manifest's `run_on`, 1 s: here 2 more segments), so the shots are not quite equal;
  `--only shots` runs this one alone;

- 8 jobs x 30 segments on 4 GPU-queue workers, and 8 jobs x 10 segments on 1 (a CPU worker
  beside them for the encode -> mux -> qc -> deliver chains);
1. generation makespan / ideal: jobs x segments x seconds-per-segment / workers (target
   <= 1.02), from the jobs' creation to the last segment generated;
2. per-segment overhead: for every segment, the time since the same worker recorded its
   previous segment, less the generation time: stitch + seam scores + storing the segment
   and its tail + checkpoint, and the dispatch and claim where a task ends. p50 and p99
   (target p50 <= 25 ms; a Celery no-op round trip here is about 3 ms);
3. delivery: time from the jobs' creation to the first delivery / ideal and mean delivery
   time / ideal (target <= 1.05 each). Ideal: each GPU finishes the jobs it started one
   after the other, so the k-th job delivered on G GPUs finishes generating at
   ceil((k + 1) / G) x segments x seconds, plus its own CPU stages (measured: generation
   end to delivery). Jobs that
   interleave on a GPU all finish near the end: ratios of about N / G.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import psycopg2

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from factory.plan.video import video_plan  # noqa: E402
from tests.integration.cluster import Cluster, new_cluster  # noqa: E402
from tests.integration.cluster import manifest as cluster_manifest  # noqa: E402

PG_ADMIN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"


def manifest(path: Path, jobs: int, segments: int, seconds: float, batch: str = "orch") -> Path:
    """JOBS videos (j0, j1, ...) of SEGMENTS `timed` segments of SECONDS each, at 64x64."""
    frames = 8 + (segments - 1) * 6  # segments of 8 frames, overlap 2
    prompts = [f"job {i}" for i in range(jobs)]
    return cluster_manifest(path, batch, prompts, seconds, duration=frames / 8,
                            resolution="64x64", renditions=("compat",), id_prefix="j")  # fmt: skip


def overheads(cluster: Cluster, job_ids: list[str], seconds: float) -> list[float]:
    """Per segment: the time since the same worker's previous segment was recorded (or since
    it claimed its first job), less the generation time. Whatever a worker does between two
    segments is counted: stitch, seam scores, storing, the checkpoint, and any dispatch and
    claim between tasks."""
    machine = cluster.factory().jobs
    by_worker: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for job_id in job_ids:
        events = machine.events(job_id)
        holder = {e.attempt: e.detail["worker"] for e in events if e.event == "claimed"}
        for e in events:
            worker = holder.get(e.attempt, "")
            if "gpu" in worker and e.event in ("claimed", "segment.done"):
                by_worker[worker].append((e.at.timestamp(), e.event))
    result = []
    for timeline in by_worker.values():
        timeline.sort()
        since = None
        for at, kind in timeline:
            if kind == "segment.done" and since is not None:
                result.append(at - since - seconds)
            if kind == "segment.done" or since is None:
                since = at
    return result


def deliveries(cluster: Cluster, job_ids: list[str], started: float) -> list[tuple[float, float]]:
    """Per job (by delivery): seconds from the submit to delivered, and its CPU stages' time
    (from the end of its generation to its delivery)."""
    machine = cluster.factory().jobs
    found = []
    for job_id in job_ids:
        events = machine.events(job_id)
        ended = max(e.at.timestamp() for e in events if e.event == "segment.done")
        done = max(
            e.at.timestamp()
            for e in events
            if e.event == "advanced" and e.detail.get("from") == "deliver"
        )
        found.append((done - started, done - ended))
    return sorted(found)


@contextlib.contextmanager
def throwaway_cluster(workers: int) -> Iterator[tuple[Cluster, Path]]:
    """WORKERS GPU workers and a CPU worker on a PostgreSQL database made for the run (and
    dropped after it), with a folder of its own."""
    name = f"factory_bench_{uuid.uuid4().hex[:8]}"
    admin = psycopg2.connect(PG_ADMIN)
    admin.autocommit = True
    admin.cursor().execute(f'CREATE DATABASE "{name}"')
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cluster = new_cluster(Path(tmp), f"postgresql+psycopg2://postgres@127.0.0.1/{name}")
            cluster.env_overrides = {"FACTORY_STALE_AFTER": "600"}
            try:
                cluster.start_workers(gpus=workers, cpu=True, beat=False)
                yield cluster, Path(tmp)
            finally:
                cluster.stop()
    finally:
        admin.cursor().execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run_batch(workers: int, jobs: int, segments: int, seconds: float) -> dict[str, float]:
    with throwaway_cluster(workers) as (cluster, tmp):
        path = manifest(tmp / "m.yaml", jobs, segments, seconds)
        ids = cluster.submit(path)
        done = cluster.wait_done(ids, timeout=3600)
        machine = cluster.factory().jobs
        # From the batch's creation (the database's clock, as every event): the
        # submitting CLI's own start-up is not the factory's orchestration.
        started = min(j.created_at for j in done).timestamp()
        last_segment = max(
            e.at.timestamp() for j in ids for e in machine.events(j) if e.event == "segment.done"
        )
        over = sorted(overheads(cluster, ids, seconds))
        delivered = deliveries(cluster, ids, started)
    assert all(j.stage.value == "done" for j in done)
    one_job = segments * seconds
    ideal = [(k // workers + 1) * one_job + tail for k, (_, tail) in enumerate(delivered)]
    actual = [at for at, _ in delivered]
    return {
        "makespan": (last_segment - started) / (jobs * one_job / workers),
        "makespan_s": last_segment - started,
        "ideal_s": jobs * one_job / workers,
        "p50_ms": statistics.median(over) * 1000,
        "p99_ms": over[min(len(over) - 1, int(0.99 * len(over)))] * 1000,
        "first": actual[0] / ideal[0],
        "first_s": actual[0],
        "mean": statistics.fmean(actual) / statistics.fmean(ideal),
        "segments": len(over),
    }


def shots_manifest(path: Path, shots: int, segments: int, seconds: float) -> Path:
    """One video of SHOTS equal shots joined by cuts, SEGMENTS `timed` segments each."""
    frames = 8 + (segments - 1) * 6  # per shot: segments of 8 frames, overlap 2, at 8 fps
    scenes = "".join(
        f"      - {{start: {k * frames / 8}, prompt: shot {k}{', join: cut' if k else ''}}}\n"
        for k in range(shots)
    )
    path.write_text(
        "batch: shots\nvideos:\n  - id: v\n"
        f"    duration: {shots * frames / 8}\n    fps: 8\n    resolution: 64x64\n"
        "    segment: {frames: 8, overlap: 2}\n    renditions: [compat]\n"
        f"    model: {{family: timed, seconds_per_segment: {seconds}}}\n    scenes:\n{scenes}"
    )
    return path


def run_shots(workers: int, shots: int, segments: int, seconds: float) -> dict[str, float]:
    """One video of SHOTS shots on WORKERS GPU workers: its generation makespan (from the
    job's creation to its last segment) / one shot's ideal time (segments x seconds)."""
    with throwaway_cluster(workers) as (cluster, tmp):
        ids = cluster.submit(shots_manifest(tmp / "m.yaml", shots, segments, seconds))
        [done] = cluster.wait_done(ids, timeout=3600)
        events = cluster.factory().jobs.events(ids[0])
    assert done.stage.value == "done"
    last = max(e.at.timestamp() for e in events if e.event == "segment.done")
    makespan = last - done.created_at.timestamp()
    holders = {e.detail["worker"] for e in events if e.event in ("claimed", "shot.joined")
               and "/gpu." in e.detail["worker"]}  # fmt: skip
    plans = video_plan(done.video)
    longest = max(sum(1 for p in plans if p.shot == k) for k in {p.shot for p in plans})
    ideal = longest * seconds
    return {"makespan": makespan / ideal, "makespan_s": makespan, "ideal_s": ideal,
            "workers": len(holders), "longest": longest}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds-per-segment", type=float, default=2.0)
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--segments", type=int, default=30)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--one-gpu-segments", type=int, default=10)
    parser.add_argument("--shot-segments", type=int, default=15)
    parser.add_argument("--only", choices=["shots"], help="Run only the video told in shots.")
    args = parser.parse_args()
    seconds = args.seconds_per_segment
    shots = run_shots(args.workers, args.workers, args.shot_segments, seconds)
    print(f"\n| one video of {args.workers} shots x {args.shot_segments} x {seconds} s on "
          f"{args.workers} GPU workers | makespan / one shot's ideal {shots['makespan']:.3f} "
          f"({shots['makespan_s']:.1f} s / {shots['ideal_s']:.1f} s: the longest shot, "
          f"{shots['longest']:.0f} segments with its run-on) | "
          f"{shots['workers']:.0f} GPU holders (target <= 1.1; one GPU would take "
          f"{args.workers}) |")  # fmt: skip
    if args.only == "shots":
        return
    runs = [
        (args.workers, args.segments, run_batch(args.workers, args.jobs, args.segments, seconds)),
        (1, args.one_gpu_segments, run_batch(1, args.jobs, args.one_gpu_segments, seconds)),
    ]
    print("\n| run | makespan / ideal | overhead p50 | p99 | first delivery / ideal | "
          "mean delivery / ideal |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for workers, segments, r in runs:
        print(
            f"| {args.jobs} x {segments} x {seconds} s on {workers} GPU worker(s) "
            f"| {r['makespan']:.3f} ({r['makespan_s']:.1f} s / {r['ideal_s']:.1f} s) "
            f"| {r['p50_ms']:.1f} ms | {r['p99_ms']:.1f} ms "
            f"| {r['first']:.3f} ({r['first_s']:.1f} s) | {r['mean']:.3f} |"
        )
    print("\ntargets: makespan <= 1.02, overhead p50 <= 25 ms, deliveries <= 1.05")


if __name__ == "__main__":
    main()
