"""Whole jobs on the s3 store through the mutual-TLS gateway, with real Celery workers: a
quick batch end to end, and a gateway outage while a job is delivering."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest

from factory.config import Settings
from factory.media.ffmpeg import ffmpeg_exe, run
from factory.media.probe import probe
from factory.pipeline.context import StageContext
from factory.pipeline.engine import STAGE_FUNCTIONS
from factory.stages import Stage
from factory.store.s3 import S3Store
from tests.conftest import run_cli
from tests.integration.cluster import Cluster, manifest
from tests.integration.test_assets import gets


@pytest.fixture
def cluster(cluster: Cluster, s3_stand, bucket) -> Cluster:
    """The shared cluster, on the s3 store through the gateway."""
    cluster.env_overrides = s3_stand.env(f"s3://{bucket}/factory")
    return cluster


def sine_bed(s3_stand, bucket: str, tmp_path: Path) -> str:
    bed = tmp_path / "sine.flac"
    run([ffmpeg_exe(), "-v", "error", "-f", "lavfi", "-i", "sine=frequency=330:duration=3",
         "-c:a", "flac", str(bed)])  # fmt: skip
    S3Store(f"s3://{bucket}", s3_stand.settings()).put_file("beds/sine.flac", bed)
    return f"s3://{bucket}/beds/sine.flac"


def objects(s3_stand, bucket: str, prefix: str) -> dict[str, bytes]:
    client = s3_stand.direct_client()
    listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return {o["Key"]: client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in listed}


def assert_intact(s3_stand, bucket: str, name: str) -> bytes:
    client = s3_stand.direct_client()
    body = client.get_object(Bucket=bucket, Key=name)["Body"].read()
    recorded = client.head_object(Bucket=bucket, Key=name)["Metadata"]["sha256"]
    assert hashlib.sha256(body).hexdigest() == recorded, name
    return body


def assert_no_secrets(s3_stand, cluster: Cluster, job_ids: list[str], extra: str = "") -> None:
    jobs = cluster.factory().jobs
    texts = [cluster.logs(), extra, (s3_stand.root / "gateway-access.log").read_text()]
    for job_id in job_ids:
        job = jobs.get(job_id)
        texts.append(json.dumps({"progress": job.progress, "error": job.last_error}))
        texts += [json.dumps(e.detail) for e in jobs.events(job_id)]
    every = "\n".join(texts)
    for secret in s3_stand.secrets():
        assert secret not in every


def test_a_quick_batch_is_delivered_through_the_gateway(cluster, s3_stand, bucket, tmp_path):
    sine_bed(s3_stand, bucket, tmp_path)
    put = run_cli("store", "put", str(tmp_path / "sine.flac"), "beds/sea.flac", env=cluster.env)
    assert put.returncode == 0, put.stderr
    assert put.stdout.strip() == f"s3://{bucket}/factory/beds/sea.flac"
    listed = run_cli("store", "ls", "beds", env=cluster.env).stdout.split()
    assert listed == ["beds/sea.flac"]
    audio = "beds/sea.flac"  # a key in the factory's own (s3) store
    path = manifest(tmp_path / "m.yaml", "s3quick", 2, duration=4, audio=audio)
    bed = f"/{bucket}/factory/beds/sea.flac"
    ids = cluster.submit(path)
    # Submit decodes the bed once to check it (a bed that is not sound is refused there).
    assert gets(s3_stand, bed, 1) == 1
    cluster.start_workers(gpus=1)
    jobs = cluster.wait_done(ids, timeout=300)
    assert [j.stage for j in jobs] == [Stage.DONE] * 2, cluster.logs()
    for job in jobs:
        video = job.spec["video_id"]
        prefix = f"factory/s3quick/{video}"
        outputs = cluster.factory().jobs.current_versions([job.job_id])[job.job_id].outputs
        assert outputs["mobile"] == f"s3://{bucket}/{prefix}/out/mobile.mp4"
        for name in ("out/mobile.mp4", "out/compat.mp4", "qc.json", "contact.png"):
            assert_intact(s3_stand, bucket, f"{prefix}/{name}")
        film = tmp_path / f"{video}.mp4"
        film.write_bytes(assert_intact(s3_stand, bucket, f"{prefix}/out/mobile.mp4"))
        facts = probe(film)
        assert facts.audio is not None and facts.video is not None
        report = json.loads(assert_intact(s3_stand, bucket, f"{prefix}/qc.json"))
        assert report["passed"] is True
    # the bed was fetched once per node into its asset cache, not once per job
    assert (cluster.home / "assets" / "index.json").exists()
    assert gets(s3_stand, bed, 2) == 2
    status = run_cli("status", ids[0], env=cluster.env)
    assert f"s3://{bucket}/factory/s3quick/v0/out/mobile.mp4" in status.stdout
    assert_no_secrets(s3_stand, cluster, ids, status.stdout + status.stderr)


def test_a_gateway_outage_during_delivery_delays_it_and_loses_nothing(
    cluster, s3_stand, bucket, tmp_path
):
    audio = sine_bed(s3_stand, bucket, tmp_path)
    path = manifest(tmp_path / "m.yaml", "outage", 1, duration=4, audio=audio)
    cluster.env_overrides["FACTORY_STALE_AFTER"] = "3"
    # Submitted without a broker, and taken through qc in this process: the job then waits
    # in `deliver`, held by this (silent) process, as after a worker died there.
    submitted = run_cli("submit", str(path), env={**cluster.env, "FACTORY_BROKER_URL": ""})
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.split()[0]
    settings = Settings.from_env({**cluster.env, "FACTORY_BROKER_URL": ""})
    factory = cluster.factory()
    ctx = StageContext.from_settings(settings, factory.jobs, factory.database)
    job = factory.jobs.claim(job_id, seen_attempt=factory.jobs.get(job_id).attempt, worker="t")
    while job.stage is not Stage.DELIVER:
        job = STAGE_FUNCTIONS[job.stage](ctx, job)
    recorded = job.progress["mux"]["muxed"]
    assert recorded["mobile"] == f"outage/v0/work/a{job.attempt}/mobile.mp4"
    muxed = {r: assert_intact(s3_stand, bucket, f"factory/{recorded[r]}")
             for r in ("mobile", "compat")}  # fmt: skip

    s3_stand.stop_gateway()
    try:
        cluster.start("cpu", "worker", "--cpu")
        cluster.start("beat", "beat")
        cluster.wait_for_workers(1)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            events = factory.jobs.events(job_id)
            if sum(e.event == "interrupted" for e in events) >= 2:
                break
            time.sleep(0.3)
        else:
            raise AssertionError(f"no repeated interruption\n{cluster.logs()}")
        job = factory.jobs.get(job_id)
        assert job.stage is Stage.DELIVER and job.progress["interrupted"]["stage"] == "deliver"
        assert "cannot reach the S3 endpoint" in job.progress["interrupted"]["reason"]
        assert job.recoveries <= 1  # interruptions do not use up FACTORY_MAX_RECOVERIES
        status = run_cli("status", job_id, env=cluster.env)
        assert "interrupted" in status.stdout and "nothing is lost" in status.stdout
        assert "cannot reach the S3 endpoint" in status.stdout
        assert not objects(s3_stand, bucket, "factory/outage/v0/out/")  # nothing half-there
    finally:
        s3_stand.start_gateway()

    [done] = cluster.wait_done([job_id], timeout=120)
    assert done.stage is Stage.DONE, cluster.logs()
    assert "interrupted" not in done.progress
    for rendition, body in muxed.items():
        delivered = assert_intact(s3_stand, bucket, f"factory/outage/v0/out/{rendition}.mp4")
        assert hashlib.sha256(delivered).digest() == hashlib.sha256(body).digest()
    assert_no_secrets(s3_stand, cluster, [job_id], status.stdout)
