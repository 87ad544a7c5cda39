"""Soak: real Celery workers on PostgreSQL and Redis, random kill -9 of GPU and CPU workers,
random operator actions and the servers themselves failing for N minutes, with the version
invariants checked all along.

    python bench/soak.py [--minutes 30] [--videos 6] [--seed 1]

Two GPU workers, a CPU worker and beat on a PostgreSQL cluster and a Redis of the soak's own
(tests/services.py: it restarts them, so it never touches the machine's shared servers),
procedural videos of a few segments, half of them in a batch that requires review, and one
video told in four shots (its shots run on both GPUs at once). The servers fail on a
schedule: Redis restarted at a quarter of the time; at half, Redis stopped for 40 s (longer
than a lease lives) while shots of the video in shots are held on both GPUs (it is requeued
from generate first, so they are); PostgreSQL restarted at three quarters.
Every ~2 s one of: kill -9 a worker's child (prefork respawns it),
kill a whole worker and start it again, requeue (plain or --from a random stage), redo a
random range, approve or reject what is in review (naming the attempt and version seen),
cancel, `factory gc` at age 0. Refusals (the action does not apply to the job's state) are
counted, not errors. After every step:

- no delivered file ever changes (SHA-256 of every file of every delivered version, taken
  when first seen);
- no job's current version ever goes back;
- every current version's files exist and its QC report passed;
- no lease holder id was given twice, and every segment file is its own holder's (named by
  the holder of its shot: no store object written by two holders).
Actions that meet a server that is down are counted as "unavailable", not as errors.

At the end the actions stop, workers are left alone, and every job must settle (done,
failed, cancelled or review) within --settle seconds, and each failed/cancelled/review job
must have a next step `factory status` names. Prints actions, kills and violations; exits 1
if any invariant was violated.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import kombu.exceptions
import redis
import sqlalchemy.exc

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from factory.errors import BadInput  # noqa: E402
from factory.ops import Operations  # noqa: E402
from factory.plan.video import video_plan  # noqa: E402
from factory.stages import Stage  # noqa: E402
from tasks.dispatch import BrokerDispatcher  # noqa: E402
from tests.conftest import run_cli  # noqa: E402
from tests.integration.cluster import Cluster, manifest, new_cluster  # noqa: E402
from tests.services import PrivatePostgres, PrivateRedis, start_postgres, start_redis  # noqa: E402

# A server that is down (or coming back) answers with one of these; the action is counted as
# unavailable, and the invariants are checked again once it answers.
UNAVAILABLE = (sqlalchemy.exc.DBAPIError, redis.RedisError, kombu.exceptions.OperationalError,
               ConnectionError)  # fmt: skip
SEGMENT_FILE = re.compile(r"(\d{5})-a\d+-h([0-9a-f]{12})\..*")
FROM_STAGES = [None, Stage.GENERATE, Stage.ENCODE, Stage.MUX, Stage.QC, Stage.DELIVER]
WORKERS = ("gpu0", "gpu1", "cpu")


class Invariants:
    def __init__(self, store: Path) -> None:
        self.store = store
        self.seen: dict[tuple[str, int, str], str] = {}  # (job, version, key) -> sha256
        self.highest: dict[str, int] = {}
        self.violations: list[str] = []

    def _path(self, url: str) -> Path:
        return Path(url.removeprefix("file://"))

    def check(self, ops: Operations, job_ids: list[str]) -> None:
        machine = ops.machine
        for job_id in job_ids:
            job = machine.get(job_id)
            versions = machine.versions(job_id)
            for v in versions:
                for name, url in (v.outputs or {}).items():
                    path = self._path(url)
                    if not path.exists():
                        self._violate(f"{job_id} v{v.version} {name}: {path} is gone")
                        continue
                    digest = hashlib.sha256(path.read_bytes()).hexdigest()
                    known = self.seen.setdefault((job_id, v.version, name), digest)
                    if known != digest:
                        self._violate(f"{job_id} v{v.version} {name} changed after delivery")
            if job.version is None:
                continue
            if job.version < self.highest.get(job_id, 0):
                self._violate(f"{job_id}: current version went back "
                              f"{self.highest[job_id]} -> {job.version}")  # fmt: skip
            self.highest[job_id] = max(self.highest.get(job_id, 0), job.version)
            current = next((v for v in versions if v.version == job.version), None)
            if current is None:
                self._violate(f"{job_id}: current version {job.version} has no delivered record")
                continue
            report = self._path((current.outputs or {}).get("qc", ""))
            if not report.is_file() or not json.loads(report.read_text()).get("passed"):
                self._violate(f"{job_id} v{job.version}: QC report missing or not passed")

    def check_holders(self, ops: Operations, store: Path, job_ids: list[str]) -> None:
        """No lease holder id given twice; every segment file named by a holder is a file of a
        shot that holder took (each holder writes under its own names only)."""
        for job_id in job_ids:
            job = ops.machine.get(job_id)
            taken = [e.detail for e in ops.machine.events(job_id) if e.event == "shot.taken"]
            holders = [t["holder"] for t in taken]
            if len(set(holders)) != len(holders):
                self._violate(f"{job_id}: a lease holder id was given twice")
            took = {(t["shot"], t["holder"]) for t in taken}
            shot_of = {p.index: p.shot for p in video_plan(job.video)}
            folder = store / job.batch / job.spec["video_id"] / "segments"
            for path in sorted(folder.glob("*")) if folder.is_dir() else []:
                found = SEGMENT_FILE.fullmatch(path.name)
                if found and (shot_of.get(int(found[1])), found[2]) not in took:
                    self._violate(f"{job_id} {path.name}: written by a holder of another shot")

    def _violate(self, what: str) -> None:
        if what not in self.violations:
            self.violations.append(what)
            print(f"  VIOLATION {what}", flush=True)


def not_sent(found: list, exc: Exception) -> None:
    print(f"broker away: {len(found)} job(s) left for the sweeper ({exc})", flush=True)


def act(rng: random.Random, cluster: Cluster, ops: Operations, job_ids: list[str],
        taken: Counter, refused: Counter) -> None:  # fmt: skip
    roll = rng.random()
    if roll < 0.15:
        name = rng.choice(WORKERS)
        children = cluster.children(name) if cluster.processes[name].poll() is None else []
        if children:
            os.kill(rng.choice(children), signal.SIGKILL)
            taken["kill -9 child"] += 1
        return
    if roll < 0.22:
        name = rng.choice(WORKERS)
        proc = cluster.processes[name]
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        restart(cluster, name)
        taken["kill -9 worker + restart"] += 1
        return
    if roll < 0.25:
        done = run_cli("gc", "--older-than", "0", env=cluster.env, timeout=120)
        (taken if done.returncode == 0 else refused)["gc"] += 1
        return
    job_id = rng.choice(job_ids)
    job = ops.job(job_id)
    try:
        if roll < 0.45:
            start = rng.choice(FROM_STAGES)
            ops.requeue(job_id, from_stage=start, actor="soak")
            kind = f"requeue --from {start.value}" if start else "requeue"
        elif roll < 0.65:
            length = job.video.duration
            a = round(rng.uniform(0, length - 1), 2)
            b = round(min(length, a + rng.uniform(0.3, 2)), 2)
            ops.redo(job_id, range_text=f"{a}-{b}", actor="soak", seed=rng.randrange(1 << 30))
            kind = "redo"
        elif roll < 0.85:
            view = ops.job_view(job_id)
            seen = view.review_candidate or {"attempt": job.attempt, "version": None}
            if rng.random() < 0.6:
                ops.approve(job_id, actor="soak", **seen)
                kind = "approve"
            else:
                ops.reject(job_id, actor="soak", reason="soak says no", **seen)
                kind = "reject"
        else:
            ops.cancel(job_id, reason="soak", actor="soak")
            kind = "cancel"
    except BadInput:
        refused["operator action"] += 1
        return
    taken[kind] += 1


def shots_manifest(path: Path) -> Path:
    """One video of 16 s in four shots (cuts and a dissolve), procedural, 8 fps."""
    path.write_text(
        "batch: soaks\n"
        "videos:\n"
        "  - id: v\n"
        "    duration: 16\n    fps: 8\n    resolution: 96x64\n    seed: 11\n"
        "    segment: {frames: 8, overlap: 2}\n    renditions: [mobile, compat]\n"
        "    model: procedural\n"
        "    scenes:\n"
        "      - {start: 0, prompt: a harbor at dawn}\n"
        "      - {start: 4, prompt: a city at night, join: cut}\n"
        "      - {start: 8, prompt: a forest in rain, join: {transition: dissolve, seconds: 1}}\n"
        "      - {start: 12, prompt: a desert road, join: cut}\n"
    )
    return path


class ServerFaults:
    """Redis restarted at 1/4 of the run, stopped for 40 s at 1/2 while shots of the video in
    shots are held on two GPUs, PostgreSQL restarted at 3/4."""

    def __init__(self, minutes: float, redis_server: PrivateRedis, postgres: PrivatePostgres,
                 shots_job: str, outage: float) -> None:  # fmt: skip
        span = minutes * 60
        self.due = [(span / 4, "redis restart"), (span / 2, "redis outage"),
                    (span * 3 / 4, "postgres restart")]  # fmt: skip
        self.redis = redis_server
        self.postgres = postgres
        self.shots_job = shots_job
        self.outage = outage
        self.taken: list[str] = []
        self.down_until: float | None = None

    def step(self, elapsed: float, ops: Operations, log) -> None:
        """Operators go on acting while Redis is down (their actions meet the outage)."""
        if self.down_until is not None and time.monotonic() >= self.down_until:
            self.redis.start()
            self.down_until = None
            log("redis back")
        if not self.due or elapsed < self.due[0][0] or self.down_until is not None:
            return
        _, fault = self.due.pop(0)
        if fault == "redis restart":
            self.redis.restart()
        elif fault == "postgres restart":
            self.postgres.restart()
        else:
            held = self._shots_held(ops, log)
            self.redis.stop()
            self.down_until = time.monotonic() + self.outage
            fault = f"redis outage {self.outage:g} s, {held} shots held on GPUs"
        log(f"fault: {fault}")
        self.taken.append(fault)

    def _shots_held(self, ops: Operations, log, timeout: float = 180) -> int:
        """Requeue the video in shots from generate (unless it generates now) and wait until
        two of its shots are taken under its current attempt."""
        job = ops.job(self.shots_job)
        if job.stage is not Stage.GENERATE:
            try:
                ops.requeue(self.shots_job, from_stage=Stage.GENERATE, actor="soak")
            except BadInput as refused:
                log(f"shots video not requeued ({refused}); outage goes ahead")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = ops.job(self.shots_job)
            if job.stage is Stage.GENERATE:
                events = ops.machine.events(self.shots_job)
                shots = {e.detail["shot"] for e in events if e.event == "shot.taken"
                         and e.detail.get("attempt") == job.attempt}  # fmt: skip
                if len(shots) >= 2:
                    return len(shots)
            time.sleep(0.2)
        return 0


def restart(cluster: Cluster, name: str) -> None:
    args = ["worker", "--gpu", name[-1]] if name.startswith("gpu") else [
        "worker", "--cpu", "--concurrency", "2"]  # fmt: skip
    cluster.start(name, *args)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--videos", type=int, default=6)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--every", type=float, default=2.0, help="seconds between actions")
    parser.add_argument("--settle", type=float, default=600.0)
    parser.add_argument("--outage", type=float, default=40.0, help="seconds Redis is down")
    parser.add_argument("--lease", type=int, default=10, help="FACTORY_LEASE_SECONDS")
    args = parser.parse_args()
    rng = random.Random(args.seed)

    def log(line: str) -> None:
        print(f"[{(time.monotonic() - started) / 60:4.1f} min] {line}", flush=True)

    scratch = Path(tempfile.mkdtemp(prefix="soak-"))
    postgres = start_postgres()
    redis_server = start_redis(scratch / "redis")
    postgres.sql("CREATE DATABASE soak")
    cluster = new_cluster(scratch, postgres.url("soak"), broker=redis_server.url())
    cluster.env_overrides["FACTORY_LEASE_SECONDS"] = str(args.lease)
    started = time.monotonic()
    try:
        cluster.start_workers(gpus=2, cpu=True, beat=True)
        half = max(1, args.videos // 2)
        plain = manifest(scratch / "plain.yaml", "soak", half, duration=4)
        reviewed = manifest(scratch / "review.yaml", "soakr", args.videos - half, duration=4)
        reviewed.write_text("review: required\n" + reviewed.read_text())
        [shots_job] = cluster.submit(shots_manifest(scratch / "shots.yaml"))
        job_ids = cluster.submit(plain) + cluster.submit(reviewed) + [shots_job]
        os.environ.update(cluster.env)
        ops = Operations(
            cluster.factory(),
            dispatcher=BrokerDispatcher(cluster.factory().settings, on_outage=not_sent),
        )
        store = cluster.home / "store"
        invariants = Invariants(store)
        faults = ServerFaults(args.minutes, redis_server, postgres, shots_job, args.outage)
        taken: Counter = Counter()
        refused: Counter = Counter()
        started = time.monotonic()
        end = started + args.minutes * 60
        last_print = started
        while time.monotonic() < end:
            try:
                faults.step(time.monotonic() - started, ops, log)
                act(rng, cluster, ops, job_ids, taken, refused)
                invariants.check(ops, job_ids)
            except UNAVAILABLE as down:
                refused["unavailable (a server is down)"] += 1
                log(f"unavailable: {type(down).__name__}: {str(down).splitlines()[0][:120]}")
            time.sleep(args.every)
            if time.monotonic() - last_print > 60:
                last_print = time.monotonic()
                try:
                    stages = dict(Counter(ops.job(j).stage.value for j in job_ids))
                except UNAVAILABLE:
                    stages = "(database unavailable)"
                log(f"actions {sum(taken.values())}, refused {sum(refused.values())}, "
                    f"stages {stages}, violations {len(invariants.violations)}")  # fmt: skip
        for name_ in WORKERS:  # every worker up for the settling
            if cluster.processes[name_].poll() is not None:
                restart(cluster, name_)
        deadline = time.monotonic() + args.settle
        while time.monotonic() < deadline:
            jobs = [ops.job(j) for j in job_ids]
            if all(j.stage.is_terminal or j.stage.is_parked for j in jobs):
                break
            time.sleep(2)
        settled_after = time.monotonic() - end
        invariants.check(ops, job_ids)
        invariants.check_holders(ops, store, job_ids)
        from factory.cli.describe import next_step as _next_step

        for job_id in job_ids:
            job = ops.job(job_id)
            if not (job.stage.is_terminal or job.stage.is_parked):
                invariants._violate(f"{job_id}: still {job.stage.value} after settling")
            elif job.stage is not Stage.DONE and "factory" not in _next_step(job):
                invariants._violate(f"{job_id}: {job.stage.value} with no next step named")
        delivered = sum(len(ops.machine.versions(j)) for j in job_ids)
        holders = sum(1 for j in job_ids for e in ops.machine.events(j) if e.event == "shot.taken")
        print(f"\nsoak: {args.minutes:g} min, {len(job_ids)} videos, seed {args.seed}")
        print(f"server faults  {faults.taken}")
        print(f"actions taken  {sum(taken.values())}: {dict(sorted(taken.items()))}")
        print(f"refused        {sum(refused.values())}: {dict(sorted(refused.items()))}")
        print(f"versions delivered {delivered}; shot leases taken {holders}; final stages "
              f"{dict(Counter(ops.job(j).stage.value for j in job_ids))}, "
              f"settled {settled_after:.0f} s after the actions stopped")  # fmt: skip
        print(f"invariant violations {len(invariants.violations)}")
        for what in invariants.violations:
            print(f"  {what}")
        return 1 if invariants.violations else 0
    finally:
        cluster.stop()
        redis_server.stop()
        postgres.stop()


if __name__ == "__main__":
    sys.exit(main())
