"""Checkpoint benchmark: what recording a segment costs at segment 3,000 against segment 10,
on a throwaway PostgreSQL database (the machine's), through the state machine.

    python bench/checkpoint.py [--segments 3000] [--repeats 200]

The factory's way (`record_segment`: a row per segment in job_segments, a slim progress
JSON with the segments done as ranges) is measured next to the way before it (every
segment's attempt, seconds, colour, seam and memory in the progress JSON, rewritten whole
at each checkpoint) in the same run. Each figure is the
median of ``repeats`` checkpoints, each of the next segment as the generate stage records
them: segments 10 to 10 + repeats, and the last ``repeats`` up to 3,000; their ratio is the
figure (target <= 1.2).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import psycopg2

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from factory.db import migrate  # noqa: E402
from factory.db.session import Database  # noqa: E402
from factory.db.state import JobStateMachine  # noqa: E402
from factory.job import SegmentRecord  # noqa: E402
from factory.manifest import parse_manifest  # noqa: E402
from factory.ops.submit import submit  # noqa: E402
from factory.qc.seams import colour_record  # noqa: E402
from factory.stages import Stage  # noqa: E402

PG_ADMIN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
# 30 fps, segments of 8 frames over 2 of overlap: 600 s (the longest allowed) is 3,000 segments
MANIFEST = """batch: ckpt
videos:
  - id: {name}
    duration: 600
    fps: 30
    resolution: 64x64
    segment: {{frames: 8, overlap: 2}}
    prompt: 'a long take'
"""


def records() -> tuple[dict, dict, dict]:
    """A colour record, a seam score and a memory record as the generate stage makes them."""
    frames = (np.random.default_rng(1).random((8, 64, 64, 3)) * 255).astype(np.uint8)
    seam = {
        "seam": 1, "frame": 6, "seconds": 0.2, "passed": True, "scene_change": False,
        "jump": 1.13, "jump_limit": 4.0, "delta_e": 0.87, "delta_l": 0.42, "ssim": 0.9312,
        "ssim_drop": 0.0121, "failures": [], "regenerations": 0,
    }  # fmt: skip
    memory = {"device": "cuda:0", "peak_allocated": 7_461_347_328, "peak_reserved": 8_589_934_592,
              "oom_retries": 0, "peak_rss": 5_368_709_120}  # fmt: skip
    return colour_record(frames), seam, memory


class Job:
    def __init__(self, machine: JobStateMachine, name: str) -> None:
        self.machine = machine
        job = submit(parse_manifest(MANIFEST.format(name=name)), machine, None).jobs[0]
        job = machine.claim(job.job_id, seen_attempt=job.attempt, worker="bench")
        self.job = machine.transition(job.job_id, attempt=job.attempt, to=Stage.GENERATE)
        assert self.job.progress["segments_total"] >= 3000, self.job.progress["segments_total"]
        self.colour, self.seam, self.memory = records()
        self.old_maps: dict[str, dict[str, object]] = {
            k: {} for k in ("segment_attempts", "segment_seconds", "colour", "seams", "memory")
        }

    def record(self, index: int) -> None:
        """The factory's checkpoint of one segment (as factory/pipeline/generate.py makes it)."""
        record = SegmentRecord(index, self.job.attempt, 1.25, self.colour, self.seam, self.memory)
        self.job = self.machine.record_segment(
            self.job.job_id,
            attempt=self.job.attempt,
            record=record,
            updates={"frame": index * 6 + 6},
            detail={"segment": index, "seconds": 1.25, "frames": 6, "memory": self.memory},
        )

    def record_the_old_way(self, index: int) -> None:
        """The checkpoint before job_segments: every segment's record in the progress JSON."""
        key = str(index)
        for name, value in (("segment_attempts", self.job.attempt), ("segment_seconds", 1.25),
                            ("colour", self.colour), ("seams", self.seam),
                            ("memory", self.memory)):  # fmt: skip
            self.old_maps[name][key] = value
        self.job = self.machine.checkpoint(
            self.job.job_id,
            attempt=self.job.attempt,
            updates={
                "segments": sorted({*self.job.progress["segments"], index}),
                "frame": index * 6 + 6,
                **{name: dict(values) for name, values in self.old_maps.items()},
            },
            event="segment.done",
            detail={"segment": index, "seconds": 1.25, "frames": 6, "memory": self.memory},
        )


def median_ms(step, indices: range) -> float:
    times = []
    for index in indices:
        started = time.perf_counter()
        step(index)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def measure(step, segments: int, repeats: int) -> tuple[float, float]:
    """Median checkpoint of segments 10 .. 10 + repeats, and of the last ``repeats`` segments
    up to ``segments``: each one the next segment, as the generate stage records them."""
    for index in range(10):
        step(index)
    early = median_ms(step, range(10, 10 + repeats))
    for index in range(10 + repeats, segments - repeats):
        step(index)
    late = median_ms(step, range(segments - repeats, segments))
    return early, late


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    name = f"factory_bench_{uuid.uuid4().hex[:8]}"
    admin = psycopg2.connect(PG_ADMIN)
    admin.autocommit = True
    admin.cursor().execute(f'CREATE DATABASE "{name}"')
    try:
        database = Database(f"postgresql+psycopg2://postgres@127.0.0.1/{name}")
        migrate.upgrade(database)
        machine = JobStateMachine(database)
        new = Job(machine, "rows")
        started = time.perf_counter()
        new_10, new_n = measure(new.record, args.segments, args.repeats)
        new_total = time.perf_counter() - started
        old = Job(machine, "json")
        started = time.perf_counter()
        old_10, old_n = measure(old.record_the_old_way, args.segments, args.repeats)
        old_total = time.perf_counter() - started
        database.dispose()
    finally:
        admin.cursor().execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    n = args.segments
    r = args.repeats
    print(f"\ncheckpoint of the next segment, median of {r}, PostgreSQL on this machine")
    print("\n| figure | factory (job_segments) | before (all in progress JSON) | target |")
    print("|---|---|---|---|")
    print(f"| segments 10-{10 + r} | {new_10:.2f} ms | {old_10:.2f} ms | |")
    print(f"| segments {n - r:,}-{n:,} | {new_n:.2f} ms | {old_n:.2f} ms | |")
    print(f"| segment {n:,} / segment 10 | {new_n / new_10:.3f} | {old_n / old_10:.2f} | <= 1.2 |")
    print(
        f"\n{n:,} segments recorded: {new_total:.1f} s with job_segments, {old_total:.1f} s "
        "the old way (measurements included)"
    )


if __name__ == "__main__":
    main()
