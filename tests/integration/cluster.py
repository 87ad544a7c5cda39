"""A real factory cluster for tests: `factory worker` / `beat` subprocesses (real Celery) on the
real Redis (broker database 12, or this pytest worker's, tests/conftest.py) and a fresh
PostgreSQL database; or on servers of the test's own (tests/services.py)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import redis

from factory.config import Settings
from factory.db import migrate
from factory.db.session import Database
from factory.job import Job
from factory.wiring import Factory
from tests.conftest import REPO, run_cli, worker_redis

BROKER = worker_redis(os.environ.get("FACTORY_TEST_BROKER_URL", "redis://127.0.0.1:6379/12"))


@dataclass
class Cluster:
    home: Path
    database_url: str
    broker: str = BROKER
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    env_overrides: dict[str, str] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return {
            "FACTORY_HOME": str(self.home),
            "FACTORY_DATABASE_URL": self.database_url,
            "FACTORY_BROKER_URL": self.broker,
            "FACTORY_REDIS_URL": self.broker,
            "FACTORY_STORE_URL": (self.home / "store").as_uri(),
            "FACTORY_STALE_AFTER": "4",
            "FACTORY_SWEEP_EVERY": "1",
            "FACTORY_HEARTBEAT_EVERY": "1",
            "FACTORY_MAX_RECOVERIES": "10",
            # This machine has no GPU: a `--gpu N` worker runs the GPU stages on the CPU only
            # when told to (it refuses otherwise, factory/generate/devices.py).
            "FACTORY_WORKER_ALLOW_CPU": "1",
            **self.env_overrides,
        }

    def start(
        self, name: str, *args: str, extra_env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        log = open(self.home / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        proc = subprocess.Popen(
            [sys.executable, "-m", "factory", *args],
            cwd=REPO,
            env={**os.environ, **self.env, **(extra_env or {})},
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        self.processes[name] = proc
        return proc

    def start_workers(self, gpus: int = 2, cpu: bool = True, beat: bool = True) -> None:
        for gpu in range(gpus):
            self.start(f"gpu{gpu}", "worker", "--gpu", str(gpu))
        if cpu:
            self.start("cpu", "worker", "--cpu", "--concurrency", "2")
        if beat:
            self.start("beat", "beat")
        self.wait_for_workers(gpus + (1 if cpu else 0))

    def wait_for_workers(self, count: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready = sum(
                b"ready" in (self.home / f"{n}.log").read_bytes()
                for n in self.processes
                if n != "beat"
            )
            if ready >= count:
                return
            time.sleep(0.2)
        raise AssertionError(f"workers not ready\n{self.logs()}")

    def children(self, name: str) -> list[int]:
        out = subprocess.run(
            ["pgrep", "-P", str(self.processes[name].pid)], capture_output=True, text=True
        ).stdout
        return [int(p) for p in out.split()]

    def stop(self) -> None:
        for proc in self.processes.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.processes.values():
            proc.wait()
        self.processes.clear()

    def factory(self) -> Factory:
        return Factory.open(Settings.from_env(self.env))

    def submit(self, manifest: Path) -> list[str]:
        done = run_cli("submit", str(manifest), env=self.env)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    def wait_done(self, job_ids: list[str], timeout: float = 240) -> list[Job]:
        machine = self.factory().jobs
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            jobs = [machine.get(j) for j in job_ids]
            if all(j.stage.is_terminal for j in jobs):
                return jobs
            time.sleep(0.3)
        states = {j.job_id: (j.stage.value, len(j.progress["segments"])) for j in jobs}
        raise AssertionError(f"not finished in {timeout} s: {states}\n{self.logs()}")

    def wait_segments(self, job_id: str, count: int, timeout: float = 60) -> None:
        machine = self.factory().jobs
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(machine.get(job_id).progress["segments"]) >= count:
                return
            time.sleep(0.05)
        raise AssertionError(f"{job_id} did not reach {count} segments\n{self.logs()}")

    def segment_counts(self, job_id: str) -> Counter:
        events = self.factory().jobs.events(job_id)
        return Counter(e.detail["segment"] for e in events if e.event == "segment.done")

    def outputs(self, job: Job) -> dict[str, str]:
        return output_digests(self.home / "store", job)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n" + p.read_text(errors="replace")[-3000:]
            for p in sorted(self.home.glob("*.log"))
        )


def output_digests(store_root: Path, job: Job) -> dict[str, str]:
    """sha256 of each delivered file of a job, by name."""
    out = store_root / job.batch / job.spec["video_id"] / "out"
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("*"))}


def new_cluster(tmp_path: Path, database_url: str, broker: str = BROKER) -> Cluster:
    redis.Redis.from_url(broker).flushdb()
    database = Database(database_url)
    migrate.upgrade(database)
    database.dispose()
    home = tmp_path / "home"
    home.mkdir()
    return Cluster(home, database_url, broker)


def manifest(
    path: Path,
    batch: str,
    videos: int | list[str],
    seconds_per_segment: float | None = None,
    duration: float = 6,
    audio: str | None = None,
    *,
    resolution: str = "96x64",
    segment: tuple[int, int] = (8, 2),
    renditions: tuple[str, ...] = ("mobile", "compat"),
    id_prefix: str = "v",
) -> Path:
    """A manifest of videos at 8 fps, written to PATH: VIDEOS is their prompts, or how many
    (prompts `scene number N`), with ids ID_PREFIX + N; SEGMENT is (frames, overlap); the
    model is `timed` at SECONDS_PER_SEGMENT, or procedural without."""
    prompts = [f"scene number {i}" for i in range(videos)] if isinstance(videos, int) else videos
    model = (
        f"{{family: timed, seconds_per_segment: {seconds_per_segment}}}"
        if seconds_per_segment is not None
        else "procedural"
    )
    frames, overlap = segment
    lines = [
        f"batch: {batch}",
        "defaults:",
        f"  duration: {duration}",
        "  fps: 8",
        f"  resolution: {resolution}",
        f"  segment: {{frames: {frames}, overlap: {overlap}}}",
        f"  renditions: [{', '.join(renditions)}]",
        f"  model: {model}",
        *([f"  audio: {{asset: '{audio}'}}"] if audio else []),
        "videos:",
    ]
    lines += [f"  - {{id: {id_prefix}{i}, prompt: '{p}'}}" for i, p in enumerate(prompts)]
    path.write_text("\n".join(lines) + "\n")
    return path
