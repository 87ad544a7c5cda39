"""`factory gc`: the intermediates of delivered jobs go after the retention policy, and only
theirs; a requeue from generate afterwards makes the same video again. Real PostgreSQL, real
ffmpeg, on the file store and on S3 through the mutual-TLS gateway (moto behind nginx)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from factory.config import Settings
from factory.db import migrate
from factory.db.session import Database
from factory.errors import InvalidOperation
from factory.job import Job
from factory.manifest import load_manifest
from factory.media.ffmpeg import ffmpeg_exe
from factory.ops import retention
from factory.ops.submit import submit
from factory.pipeline.context import StageContext
from factory.pipeline.generate import run_generate
from factory.pipeline.runner import run_job
from factory.stages import Stage
from factory.store import Store, open_store
from factory.wiring import Factory
from tests.conftest import REPO, manifest_text, run_cli_here
from tests.conftest import embedded_env as home_env

RENDITIONS = ("master", "mobile", "compat")


@pytest.fixture(params=["file", "s3"])
def env(request, tmp_path: Path, pg_url: str) -> dict[str, str]:
    """A factory on PostgreSQL, with the file store or the S3 stand as its store."""
    values = {**home_env(tmp_path / "home"), "FACTORY_DATABASE_URL": pg_url}
    if request.param == "s3":
        stand = request.getfixturevalue("s3_stand")
        bucket = stand.make_bucket(f"gc-{uuid.uuid4().hex[:12]}")
        values |= stand.env(f"s3://{bucket}/factory")
    database = Database(pg_url)
    migrate.upgrade(database)
    database.dispose()
    return values


@dataclasses.dataclass
class Bench:
    env: dict[str, str]
    factory: Factory
    ctx: StageContext
    store: Store

    def submit(self, path: Path) -> list[str]:
        return [j.job_id for j in submit(load_manifest(path), self.factory.jobs, None).jobs]

    def run(self, job_id: str, ctx: StageContext | None = None) -> Job:
        return run_job(ctx or self.ctx, job_id, worker="test/gc")

    def job(self, job_id: str) -> Job:
        return self.factory.jobs.get(job_id)

    def listing(self, prefix: str) -> dict[str, int]:
        return dict(self.store.list_sizes(prefix))

    def cli(self, *args: str, **extra: str) -> subprocess.CompletedProcess:
        return run_cli_here(*args, env={**self.env, **extra}, timeout=300)


def make_bench(env: dict[str, str]) -> Bench:
    settings = Settings.from_env(env)
    factory = Factory.open(settings)
    ctx = StageContext.from_settings(settings, factory.jobs, factory.database)
    return Bench(env, factory, ctx, open_store(settings.store_url, settings.s3))


def is_intermediate(key: str) -> bool:
    """The policy in docs/storage.md, said again independently of factory/ops/retention.py."""
    rel = key.split("/", 2)[2]  # after {batch}/{video}/
    if rel.startswith("segments/"):
        return rel.endswith((".mkv", ".tail.npy"))
    if rel.startswith("chunks/"):
        return True
    return rel.startswith("work/") and rel.endswith((".mp4", ".m4a"))


def finished_at(job: Job) -> datetime:
    deliver = job.progress["timings"]["deliver"]
    return datetime.fromisoformat(deliver["started_at"]) + timedelta(seconds=deliver["seconds"])


def gc_events(bench: Bench, job_id: str) -> list[Any]:
    return [e for e in bench.factory.jobs.events(job_id) if e.event == "gc"]


def decoded(bench: Bench, job: Job, rendition: str) -> str:
    """The sha256 of every decoded frame of a delivered rendition (pixels, not the file)."""
    key = f"{job.batch}/{job.video_id}/out/{rendition}.mp4"
    with bench.store.local_path(key) as path:
        raw = subprocess.run(
            [ffmpeg_exe(), "-v", "error", "-i", str(path), "-map", "0:v", "-f", "rawvideo", "-"],
            capture_output=True, check=True,
        ).stdout  # fmt: skip
    assert len(raw) > 0
    return hashlib.sha256(raw).hexdigest()


def test_gc_removes_exactly_the_intermediates_the_policy_allows(env, tmp_path: Path):
    bench = make_bench(env)
    manifest = tmp_path / "m.yaml"
    manifest.write_text(manifest_text("gcb", videos=5, duration=2))
    old, failed_qc, running, cancelled, recent = bench.submit(manifest)

    assert bench.run(old).stage is Stage.DONE
    # delivered once, then redone from qc and failed there: its delivery failed QC
    assert bench.run(failed_qc).stage is Stage.DONE
    bench.factory.jobs.requeue(failed_qc, from_stage=Stage.QC)
    strict = dataclasses.replace(bench.ctx, qc=dataclasses.replace(bench.ctx.qc, min_psnr=99.0))
    failed = bench.run(failed_qc, strict)
    assert failed.stage is Stage.FAILED and failed.last_error["kind"] == "QualityGateFailed"
    # running: generated, now in encode, held by a worker
    job = bench.factory.jobs.get(running)
    job = bench.factory.jobs.claim(running, seen_attempt=job.attempt, worker="gpu-1/0")
    assert run_generate(bench.ctx, job).stage is Stage.ENCODE
    # cancelled after generating
    job = bench.factory.jobs.claim(cancelled, seen_attempt=0, worker="gpu-2/0")
    run_generate(bench.ctx, job)
    bench.factory.jobs.cancel(cancelled, reason="wrong prompt")
    gap = 12 - (bench.factory.jobs.current_time() - finished_at(bench.job(old))).total_seconds()
    time.sleep(max(0.0, gap))  # the policy must tell `old` and `recent` apart by seconds
    assert bench.run(recent).stage is Stage.DONE

    before = bench.listing("gcb")
    by_job = {j: {k for k in before if k.startswith(f"gcb/{j.split('.')[1]}/")} for j in
              (old, failed_qc, running, cancelled, recent)}  # fmt: skip
    expected = {k for k in by_job[old] if is_intermediate(k)}
    video = "gcb/v00/"
    assert {k.removeprefix(video).split("/")[0] for k in expected} == {"segments", "chunks", "work"}
    assert any(k.endswith(".tail.npy") for k in expected)
    assert {k.rsplit("/", 1)[1] for k in expected if "/work/" in k} == {
        "audio.m4a",
        *(f"{r}.video.mp4" for r in RENDITIONS),
        *(f"{r}.mp4" for r in RENDITIONS),
    }
    kept = by_job[old] - expected
    assert {f"{video}out/{r}.mp4" for r in RENDITIONS} | {
        f"{video}{name}" for name in ("qc.json", "contact.png", "quality.png")
    } <= kept
    assert any("/chunks/qc/" in k for k in expected)  # the chunks' QC measurements go too
    assert {k.rsplit("/", 1)[1] for k in kept if "/work/" in k} == {
        "qc.json",
        "contact.png",
        "quality.png",
    }
    # older than `old`'s delivery, younger than `recent`'s
    now = bench.factory.jobs.current_time()
    older_than = f"{int((now - finished_at(bench.job(old))).total_seconds()) - 2}s"

    dry = bench.cli("gc", "--older-than", older_than, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    planned = json.loads(dry.stdout)
    assert planned["dry_run"] is True and [j["job_id"] for j in planned["per_job"]] == [old]
    assert set(planned["per_job"][0]["keys"]) == expected
    assert planned["objects"] == len(expected)
    assert planned["bytes"] == sum(before[k] for k in expected)
    assert planned["kept_jobs"] == {
        "delivered too recently": 1,
        "not done (cancelled)": 1,
        "not done (encode)": 1,
        "not done (failed)": 1,
    }
    text = bench.cli("gc", "--older-than", older_than, "--dry-run")
    assert "would remove" in text.stdout and "dry run: nothing removed" in text.stdout
    assert bench.listing("gcb") == before
    assert gc_events(bench, old) == [] and "gc" not in bench.job(old).progress

    done = bench.cli("gc", "--older-than", older_than, "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert [(j["job_id"], j["state"]) for j in result["per_job"]] == [(old, "removed")]
    assert set(result["per_job"][0]["keys"]) == expected
    freed = sum(before[k] for k in expected)
    assert (result["objects"], result["bytes"]) == (len(expected), freed)
    assert set(bench.listing("gcb")) == set(before) - expected
    (event,) = gc_events(bench, old)
    assert (event.detail["objects"], event.detail["bytes"]) == (len(expected), freed)
    assert set(event.detail["kinds"]) == {"segment", "tail", "chunk", "joined", "audio", "muxed"}
    marker = bench.job(old).progress["gc"]
    assert marker["state"] == "removed" and marker["objects"] == len(expected)

    status = bench.cli("status", old)
    assert status.returncode == 0, status.stderr
    assert "intermediates removed by gc on" in status.stdout
    assert f"{len(expected)} objects" in status.stdout and "--from generate" in status.stdout
    for stage in ("encode", "mux", "qc", "deliver"):
        refused = bench.cli("requeue", old, "--from", stage)
        assert refused.returncode == 2, refused.stdout
        assert "removed by gc" in refused.stderr and "use --from generate" in refused.stderr
    assert bench.job(old).stage is Stage.DONE

    # the policy from FACTORY_KEEP_INTERMEDIATES; `old` is not collected twice
    second = bench.cli("gc", "--json", FACTORY_KEEP_INTERMEDIATES="0")
    assert second.returncode == 0, second.stderr
    again = json.loads(second.stdout)
    assert [j["job_id"] for j in again["per_job"]] == [recent]
    assert again["kept_jobs"]["already collected"] == 1
    after = bench.listing("gcb")
    for job_id in (failed_qc, running, cancelled):  # never touched: not done, or QC failed
        assert {k for k in after if k in by_job[job_id]} == by_job[job_id]
        assert gc_events(bench, job_id) == [] and "gc" not in bench.job(job_id).progress
    assert {k for k in after if k.startswith("gcb/v04/")} == {
        k for k in by_job[recent] if not is_intermediate(k)
    }
    shown = bench.cli("gc", "--older-than", "0")
    assert "freed 0 B in 0 objects" in shown.stdout and "2 already collected" in shown.stdout


def test_requeue_from_generate_after_gc_delivers_the_same_video(env, tmp_path: Path):
    bench = make_bench(env)
    manifest = tmp_path / "m.yaml"
    manifest.write_text(manifest_text("regen", videos=1, duration=2))
    (job_id,) = bench.submit(manifest)
    first = bench.run(job_id)
    assert first.stage is Stage.DONE
    frames = {r: decoded(bench, first, r) for r in RENDITIONS}

    gc = bench.cli("gc", "--older-than", "0")
    assert gc.returncode == 0, gc.stderr
    assert "freed" in gc.stdout and job_id in gc.stdout
    assert not any(is_intermediate(k) for k in bench.listing("regen"))

    requeued = bench.cli("requeue", job_id, "--from", "generate")
    assert requeued.returncode == 0, requeued.stderr
    assert "every segment is regenerated" in requeued.stdout
    assert "gc" not in bench.job(job_id).progress
    again = bench.run(job_id)
    assert again.stage is Stage.DONE, again.last_error
    assert again.progress["qc"]["passed"] is True
    assert {r: decoded(bench, again, r) for r in RENDITIONS} == frames
    regenerated = [k for k in bench.listing("regen") if k.endswith(".mkv")]
    assert len(regenerated) == again.progress["segments_total"]
    attempt = bench.factory.jobs.segment(job_id, 0).attempt
    assert all(f"-a{attempt}" in k for k in regenerated[:1])
    status = bench.cli("status", job_id)
    assert "removed by gc" not in status.stdout
    # and once more after the policy: the new intermediates go too
    assert bench.cli("gc", "--older-than", "0").returncode == 0
    assert not any(is_intermediate(k) for k in bench.listing("regen"))
    assert len(gc_events(bench, job_id)) == 2


class RequeueDuringGc:
    """Requeues one job after gc listed it (before it marks), another after it marked it
    (before its first delete), like an operator typing at the same moment."""

    def __init__(self, bench: Bench, before_mark: str, after_mark: str) -> None:
        self.bench, self.before_mark, self.after_mark = bench, before_mark, after_mark
        self.refused: str = ""

    def planned(self, plans: list[retention.JobGc]) -> None:
        assert {p.job_id for p in plans} == {self.before_mark, self.after_mark}
        self.bench.factory.jobs.requeue(self.before_mark, from_stage=Stage.ENCODE)

    def removing(self, plan: retention.JobGc) -> None:
        assert plan.job_id == self.after_mark
        with pytest.raises(InvalidOperation) as caught:  # what it needs may be going
            self.bench.factory.jobs.requeue(plan.job_id, from_stage=Stage.QC)
        self.refused = str(caught.value)
        self.bench.factory.jobs.requeue(plan.job_id, from_stage=Stage.GENERATE)

    def removed(self, plan: retention.JobGc, objects: int, size: int) -> None:
        raise AssertionError(f"{plan.job_id}: deleted {objects} objects of a requeued job")

    def finished(self, plan: retention.JobGc) -> None:
        pass


def test_a_job_requeued_while_gc_runs_keeps_its_files(env, tmp_path: Path):
    bench = make_bench(env)
    manifest = tmp_path / "m.yaml"
    manifest.write_text(manifest_text("race", videos=2, duration=1))
    first, second = bench.submit(manifest)
    assert bench.run(first).stage is Stage.DONE and bench.run(second).stage is Stage.DONE
    before = bench.listing("race")
    observer = RequeueDuringGc(bench, before_mark=first, after_mark=second)
    report = retention.collect(bench.factory.jobs, bench.store, older_than=0, observer=observer)
    assert [(j.job_id, j.state, j.objects) for j in report.jobs] == [
        (first, "requeued", 0),
        (second, "requeued", 0),
    ]
    assert "use --from generate" in observer.refused
    assert bench.listing("race") == before
    for job_id in (first, second):
        assert gc_events(bench, job_id) == [] and "gc" not in bench.job(job_id).progress
    # the requeue from encode found its segments: it delivers
    assert bench.run(first).stage is Stage.DONE


def test_gc_of_one_batch_leaves_every_other_batch_alone(env, tmp_path: Path):
    bench = make_bench(env)
    ids = []
    for batch in ("keepme", "sweepme"):
        manifest = tmp_path / f"{batch}.yaml"
        manifest.write_text(manifest_text(batch, videos=1, duration=1))
        ids += bench.submit(manifest)
    assert all(bench.run(job_id).stage is Stage.DONE for job_id in ids)
    kept_before = bench.listing("keepme")
    done = bench.cli("gc", "--older-than", "0", "--batch", "sweepme", "--json")
    assert done.returncode == 0, done.stderr
    assert [j["job_id"] for j in json.loads(done.stdout)["per_job"]] == ["sweepme.v00"]
    assert bench.listing("keepme") == kept_before
    assert gc_events(bench, "keepme.v00") == [] and len(gc_events(bench, "sweepme.v00")) == 1
    assert not any(is_intermediate(k) for k in bench.listing("sweepme"))


def test_nightly_script_runs_gc_and_a_gc_failure_does_not_hide_the_batch(tmp_path: Path):
    env = {**os.environ, **home_env(tmp_path / "home"), "TMPDIR": str(tmp_path)}
    env["FACTORY_CLI"] = str(Path(os.sys.executable).parent / "factory")
    env["FACTORY_ENV_FILE"] = str(tmp_path / "factory.env")  # present, empty: the env above
    (tmp_path / "factory.env").write_text("")
    manifest = tmp_path / "nightly.yaml"
    manifest.write_text(manifest_text("ignored", videos=1, duration=1))
    script = ["bash", str(REPO / "scripts" / "nightly.sh"), str(manifest)]
    ran = subprocess.run(script, env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    assert "1 created" in ran.stderr and "freed 0 B in 0 objects" in ran.stdout
    failing = tmp_path / "factory-without-gc"
    failing.write_text(f'#!/bin/sh\n[ "$1" = gc ] && exit 1\nexec {env["FACTORY_CLI"]} "$@"\n')
    failing.chmod(0o755)
    broken = subprocess.run(script, env={**env, "FACTORY_CLI": str(failing)},
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert broken.returncode == 0, broken.stderr
    assert "0 created, 1 already submitted" in broken.stderr
    assert "gc failed" in broken.stderr
    refused = subprocess.run([*script[:2], str(tmp_path / "missing.yaml")], env=env,
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    assert refused.returncode != 0


def test_bad_retention_settings_name_what_to_fix(tmp_path: Path):
    env = home_env(tmp_path / "home")
    bad = run_cli_here("gc", "--older-than", "7", env=env)
    assert bad.returncode == 2 and "--older-than: must be a duration like 7d" in bad.stderr
    bad = run_cli_here("gc", env={**env, "FACTORY_KEEP_INTERMEDIATES": "a week"})
    assert bad.returncode == 2 and "FACTORY_KEEP_INTERMEDIATES: must be a duration" in bad.stderr
    forever = run_cli_here("gc", env={**env, "FACTORY_KEEP_INTERMEDIATES": "forever"})
    assert forever.returncode == 0 and "nothing is removed" in forever.stderr
