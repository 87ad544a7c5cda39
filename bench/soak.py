"""Soak: real Celery workers on PostgreSQL and Redis, random kill -9 of GPU and CPU workers and
random operator actions for N minutes, with the version invariants checked all along.

    python bench/soak.py [--minutes 20] [--videos 6] [--seed 1]

Two GPU workers, a CPU worker and beat on a throwaway PostgreSQL database and Redis database
11 (the tests use 12 and 13), procedural videos of a few segments, half of them in a batch
that requires review. Every ~2 s one of: kill -9 a worker's child (prefork respawns it),
kill a whole worker and start it again, requeue (plain or --from a random stage), redo a
random range, approve or reject what is in review (naming the attempt and version seen),
cancel, `factory gc` at age 0. Refusals (the action does not apply to the job's state) are
counted, not errors. After every step:

- no delivered file ever changes (SHA-256 of every file of every delivered version, taken
  when first seen);
- no job's current version ever goes back;
- every current version's files exist and its QC report passed.

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
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import psycopg2

os.environ.setdefault("FACTORY_TEST_BROKER_URL", "redis://127.0.0.1:6379/11")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from factory.errors import BadInput  # noqa: E402
from factory.ops import Operations  # noqa: E402
from factory.stages import Stage  # noqa: E402
from tasks.dispatch import BrokerDispatcher  # noqa: E402
from tests.conftest import run_cli  # noqa: E402
from tests.integration.cluster import Cluster, manifest, new_cluster  # noqa: E402

PG_ADMIN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
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
        args = ["worker", "--gpu", name[-1]] if name.startswith("gpu") else [
            "worker", "--cpu", "--concurrency", "2"]  # fmt: skip
        cluster.start(name, *args)
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--videos", type=int, default=6)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--every", type=float, default=2.0, help="seconds between actions")
    parser.add_argument("--settle", type=float, default=600.0)
    args = parser.parse_args()
    rng = random.Random(args.seed)

    name = f"factory_soak_{uuid.uuid4().hex[:8]}"
    admin = psycopg2.connect(PG_ADMIN)
    admin.autocommit = True
    admin.cursor().execute(f'CREATE DATABASE "{name}"')
    scratch = Path(tempfile.mkdtemp(prefix="soak-"))
    cluster = new_cluster(scratch, f"postgresql+psycopg2://postgres@127.0.0.1:5432/{name}")
    try:
        cluster.start_workers(gpus=2, cpu=True, beat=True)
        half = max(1, args.videos // 2)
        plain = manifest(scratch / "plain.yaml", "soak", half, duration=4)
        reviewed = manifest(scratch / "review.yaml", "soakr", args.videos - half, duration=4)
        reviewed.write_text("review: required\n" + reviewed.read_text())
        job_ids = cluster.submit(plain) + cluster.submit(reviewed)
        os.environ.update(cluster.env)
        ops = Operations(
            cluster.factory(),
            dispatcher=BrokerDispatcher(cluster.factory().settings, on_outage=not_sent),
        )
        invariants = Invariants(cluster.home / "store")
        taken: Counter = Counter()
        refused: Counter = Counter()
        started = time.monotonic()
        end = started + args.minutes * 60
        last_print = started
        while time.monotonic() < end:
            act(rng, cluster, ops, job_ids, taken, refused)
            invariants.check(ops, job_ids)
            time.sleep(args.every)
            if time.monotonic() - last_print > 60:
                last_print = time.monotonic()
                stages = Counter(ops.job(j).stage.value for j in job_ids)
                print(f"[{(last_print - started) / 60:4.1f} min] actions {sum(taken.values())}, "
                      f"refused {sum(refused.values())}, stages {dict(stages)}, "
                      f"violations {len(invariants.violations)}", flush=True)  # fmt: skip
        for name_ in WORKERS:  # every worker up for the settling
            if cluster.processes[name_].poll() is not None:
                args_ = ["worker", "--gpu", name_[-1]] if name_.startswith("gpu") else [
                    "worker", "--cpu", "--concurrency", "2"]  # fmt: skip
                cluster.start(name_, *args_)
        deadline = time.monotonic() + args.settle
        while time.monotonic() < deadline:
            jobs = [ops.job(j) for j in job_ids]
            if all(j.stage.is_terminal or j.stage.is_parked for j in jobs):
                break
            time.sleep(2)
        invariants.check(ops, job_ids)
        from factory.cli.describe import next_step as _next_step

        for job_id in job_ids:
            job = ops.job(job_id)
            if not (job.stage.is_terminal or job.stage.is_parked):
                invariants._violate(f"{job_id}: still {job.stage.value} after settling")
            elif job.stage is not Stage.DONE and "factory" not in _next_step(job):
                invariants._violate(f"{job_id}: {job.stage.value} with no next step named")
        delivered = sum(len(ops.machine.versions(j)) for j in job_ids)
        print(f"\nsoak: {args.minutes:g} min, {len(job_ids)} videos, seed {args.seed}")
        print(f"actions taken  {sum(taken.values())}: {dict(sorted(taken.items()))}")
        print(f"refused        {sum(refused.values())} (did not apply to the job's state)")
        print(f"versions delivered {delivered}; final stages "
              f"{dict(Counter(ops.job(j).stage.value for j in job_ids))}")  # fmt: skip
        print(f"invariant violations {len(invariants.violations)}")
        for what in invariants.violations:
            print(f"  {what}")
        return 1 if invariants.violations else 0
    finally:
        cluster.stop()
        subprocess.run(["redis-cli", "-n", "11", "flushdb"], capture_output=True)
        admin.cursor().execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


if __name__ == "__main__":
    sys.exit(main())
