"""The last chunk of a video is wanted twice at once: by its chunk message (sent when its last
segment is stored) and by the CPU chain's encode stage (sent right after). Two real CPU
workers with different CPUs (x264 sizes its threads from them: the same frames give other
bytes) take one message each; the first to start encoding the last rendition (x264) is frozen
(SIGSTOP) for a while.
However the two meet, the measurement the quality gate uses must be of the bytes that were
joined and delivered (issue 32, defect 5): one encode, or a measurement keyed by content."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from factory.media.probe import video_packet_digests
from factory.plan.chunks import plan_chunks
from factory.stages import Stage
from tests.integration.cluster import Cluster, manifest


def _encoding(cluster: Cluster, names: list[str]) -> str | None:
    """The CPU worker whose pool child is encoding the compat rendition (the last one, x264:
    its bytes depend on the CPUs) now."""
    for name in names:
        try:
            for child in psutil.Process(cluster.processes[name].pid).children():
                for run in child.children():
                    if "libx264" in run.cmdline():
                        return name
        except psutil.NoSuchProcess:
            continue
    return None


def _pause(cluster: Cluster, name: str, stop: bool) -> None:
    os.killpg(cluster.processes[name].pid, signal.SIGSTOP if stop else signal.SIGCONT)


def test_the_measurement_qc_uses_is_of_the_chunk_bytes_delivered(
    cluster: Cluster, tmp_path: Path
) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs: workers on the same CPUs encode the same bytes")
    # One segment, one chunk: the last chunk is the only one.
    path = manifest(tmp_path / "m.yaml", "race", ["a red kite over a green hill"], duration=2,
                    resolution="480x288", segment=(16, 4))  # fmt: skip
    cluster.start("gpu0", "worker", "--gpu", "0")
    cluster.start("fast", "worker", "--cpu", "--concurrency", "1")
    os.sched_setaffinity(0, cpus[:1])  # the other CPU worker has one CPU (inherited)
    try:
        cluster.start("slow", "worker", "--cpu", "--concurrency", "1")
    finally:
        os.sched_setaffinity(0, cpus)
    cluster.wait_for_workers(3)
    (job_id,) = cluster.submit(path)
    machine = cluster.factory().jobs
    store = cluster.home / "store"
    measured = store / "race" / "v0" / "chunks" / "qc"

    def measurements() -> list[Path]:
        return sorted(measured.glob("*.json")) if measured.exists() else []

    workers = ["fast", "slow"]
    deadline = time.monotonic() + 60
    first = None
    while first is None:
        assert time.monotonic() < deadline, cluster.logs()
        first = _encoding(cluster, workers)
    _pause(cluster, first, True)  # frozen in the middle of its encode
    other = next(w for w in workers if w != first)
    paused = [first]
    try:
        # The other worker takes the other message: either the encode stage (the job moves
        # on to mux) or the chunk message (its measurement appears). Or it waits.
        until = time.monotonic() + 4
        outcome = "waited"
        while time.monotonic() < until:
            if machine.get(job_id).stage is not Stage.ENCODE:
                outcome = "encode stage done"
                _pause(cluster, other, True)  # hold mux and qc there
                paused.append(other)
                break
            if measurements():
                outcome = "chunk message done"
                break
            time.sleep(0.01)
        _pause(cluster, first, False)
        paused.remove(first)
        if other in paused:  # the frozen one was the chunk message: let it measure first
            until = time.monotonic() + 30
            while not measurements() and time.monotonic() < until:
                time.sleep(0.05)
    finally:
        for name in paused:
            _pause(cluster, name, False)
    (job,) = cluster.wait_done([job_id], timeout=120)
    print(f"first encoder: {first}; then: {outcome}")
    assert job.stage is Stage.DONE, f"{outcome}: {job.last_error}\n{cluster.logs()}"
    assert job.progress["qc"]["passed"] is True
    # The chunk in the store is the one joined and delivered, and a measurement of exactly
    # those packets is what the report was made from.
    (chunk,) = plan_chunks(job.video)
    chunks = store / "race" / "v0" / "chunks"
    for rendition in ("mobile", "compat"):
        (stored,) = sorted((chunks / rendition).glob("00000-*.mp4"))
        delivered = store / "race" / "v0" / "out" / f"{rendition}.mp4"
        packets = video_packet_digests(stored, [chunk.frames])[0]
        assert video_packet_digests(delivered, [chunk.frames])[0] == packets
        found = [json.loads(p.read_text())["renditions"][rendition]["packets"]
                 for p in measurements()]  # fmt: skip
        assert {"count": packets[0], "sha256": packets[1]} in found
