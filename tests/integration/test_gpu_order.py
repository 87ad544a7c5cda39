"""One GPU finishes the video it holds: a GPU worker takes its own queue (its job's next
segment) strictly before the shared `gpu` queue, so jobs never interleave on a GPU and the
first videos are delivered early in the night. Real Celery workers on Redis and PostgreSQL."""

from __future__ import annotations

from itertools import groupby
from pathlib import Path

from factory.stages import Stage
from tests.integration.cluster import Cluster, manifest


def segments_by_worker(cluster: Cluster, job_ids: list[str]) -> dict[str, list[str]]:
    """Per GPU worker, the job of every segment it made, in the order they were recorded."""
    machine = cluster.factory().jobs
    done: list[tuple[int, str, str]] = []
    for job_id in job_ids:
        events = machine.events(job_id)
        holder = {e.attempt: e.detail["worker"] for e in events if e.event == "claimed"}
        done += [(e.id, job_id, holder[e.attempt]) for e in events if e.event == "segment.done"]
    timeline: dict[str, list[str]] = {}
    for _, job_id, worker in sorted(done):
        timeline.setdefault(worker.split("/")[1], []).append(job_id)
    return timeline


def runs(jobs: list[str]) -> list[str]:
    """The jobs in the order a worker held them, one entry per uninterrupted run."""
    return [job for job, _ in groupby(jobs)]


def niceness(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def delivered_at(cluster: Cluster, job_id: str) -> int:
    events = cluster.factory().jobs.events(job_id)
    return max(e.id for e in events if e.event == "advanced" and e.detail["from"] == "deliver")


def test_one_gpu_finishes_each_job_before_it_takes_the_next(cluster: Cluster, tmp_path: Path):
    path = manifest(tmp_path / "m.yaml", "order", videos=3, seconds_per_segment=0.1, duration=8)
    cluster.start_workers(gpus=1, cpu=True, beat=False)
    # the CPU stages run below the GPU worker's priority (`--nice 10`): an encode on the
    # same node never delays the segment path
    gpu_nice = {niceness(pid) for pid in [cluster.processes["gpu0"].pid, *cluster.children("gpu0")]}
    cpu_nice = {niceness(pid) for pid in [cluster.processes["cpu"].pid, *cluster.children("cpu")]}
    assert gpu_nice == {0} and cpu_nice == {10}, (gpu_nice, cpu_nice)
    ids = cluster.submit(path)
    jobs = cluster.wait_done(ids, timeout=300)
    assert [j.stage for j in jobs] == [Stage.DONE] * 3, cluster.logs()
    (made,) = segments_by_worker(cluster, ids).values()
    assert len(made) == 3 * jobs[0].progress["segments_total"]
    assert runs(made) == ids, made  # a, a, ..., b, b, ..., c, c: never interleaved
    assert sorted(ids, key=lambda j: delivered_at(cluster, j)) == ids


def test_two_gpus_each_keep_their_jobs_apart(cluster: Cluster, tmp_path: Path):
    path = manifest(tmp_path / "m.yaml", "pair", videos=4, seconds_per_segment=0.1, duration=8)
    cluster.start_workers(gpus=2, cpu=True, beat=False)
    ids = cluster.submit(path)
    jobs = cluster.wait_done(ids, timeout=300)
    assert [j.stage for j in jobs] == [Stage.DONE] * 4, cluster.logs()
    timeline = segments_by_worker(cluster, ids)
    assert len(timeline) == 2, timeline  # both GPUs worked
    for worker, made in timeline.items():
        held = runs(made)
        assert len(held) == len(set(held)), f"{worker} interleaved its jobs: {made}"
    assert sorted(j for made in timeline.values() for j in set(made)) == sorted(ids)


def gpu_claims(cluster: Cluster, job_id: str) -> int:
    events = cluster.factory().jobs.events(job_id)
    return sum(e.event == "claimed" and "/gpu." in e.detail["worker"] for e in events)


def test_a_gpu_task_makes_segments_for_its_time_budget(cluster: Cluster, tmp_path: Path):
    """FACTORY_GPU_TASK_SECONDS: one task (one claim) makes segment after segment, each one
    recorded, until its budget is spent; 0 gives a task, and a claim, per segment."""
    path = manifest(tmp_path / "m.yaml", "loop", videos=1, seconds_per_segment=0.1, duration=8)
    cluster.env_overrides = {"FACTORY_GPU_TASK_SECONDS": "0"}
    cluster.start("gpu0", "worker", "--gpu", "0")
    cluster.start("cpu", "worker", "--cpu")
    cluster.wait_for_workers(2)
    (per_segment,) = cluster.submit(path)
    (job,) = cluster.wait_done([per_segment], timeout=300)
    total = job.progress["segments_total"]
    assert gpu_claims(cluster, per_segment) == total
    cluster.stop()
    cluster.env_overrides = {"FACTORY_GPU_TASK_SECONDS": "60"}
    cluster.start_workers(gpus=1, cpu=True, beat=False)
    second = manifest(tmp_path / "m2.yaml", "loop2", videos=1, seconds_per_segment=0.1, duration=8)
    (looped,) = cluster.submit(second)
    (job,) = cluster.wait_done([looped], timeout=300)
    assert job.stage is Stage.DONE
    assert gpu_claims(cluster, looped) == 1  # ~3 s of segments: one task
    assert set(cluster.segment_counts(looped).values()) == {1}
    assert sorted(cluster.segment_counts(looped)) == list(range(total))
