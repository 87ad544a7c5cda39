"""The production topology with real `celery worker` processes, Redis and PostgreSQL."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import requests

from factory.db.state import JobStateMachine
from factory.stages import Stage
from tests.conftest import REPO, embedded_env, run_cli
from tests.integration.cluster import BROKER, Cluster, manifest, new_cluster, output_digests
from tests.s3stand import free_port
from tests.services import PrivatePostgres, PrivateRedis, start_postgres, start_redis


@dataclass
class OwnServers:
    """A cluster on a PostgreSQL and a Redis of its own, which the test may take down."""

    cluster: Cluster
    postgres: PrivatePostgres
    redis: PrivateRedis


@pytest.fixture
def own_servers(tmp_path: Path) -> Iterator[OwnServers]:
    postgres = start_postgres()
    broker = None
    made = None
    try:
        broker = start_redis(tmp_path / "redis")
        made = new_cluster(tmp_path, postgres.url(), broker.url())
        yield OwnServers(made, postgres, broker)
    finally:
        if made:
            made.stop()
        if broker:
            broker.stop()
        postgres.stop()


def test_a_batch_over_two_gpu_workers_and_a_cpu_worker(cluster: Cluster, tmp_path: Path):
    cluster.start_workers(gpus=2)
    ids = cluster.submit(manifest(tmp_path / "m.yaml", "batch8", videos=8))
    jobs = cluster.wait_done(ids)
    assert [j.stage for j in jobs] == [Stage.DONE] * 8, cluster.logs()
    workers = set()
    for job in jobs:
        assert job.progress["qc"]["passed"] is True
        assert set(cluster.outputs(job)) == {"mobile.mp4", "compat.mp4"}
        assert set(cluster.segment_counts(job.job_id).values()) == {1}
        events = cluster.factory().jobs.events(job.job_id)
        workers |= {e.detail["worker"].split("/")[1] for e in events if e.event == "claimed"}
        assert len({e.trace_id for e in events}) == 1
    host = socket.gethostname()
    assert {f"gpu.{host}.0", f"gpu.{host}.1"} <= workers
    # Resubmitting (cron firing twice) creates and dispatches nothing.
    again = run_cli("submit", str(tmp_path / "m.yaml"), "--json", env=cluster.env)
    assert '"created": true' not in again.stdout


def test_killed_workers_cost_at_most_one_segment_each(cluster: Cluster, tmp_path: Path):
    path = manifest(tmp_path / "m.yaml", "chaos", videos=3, seconds_per_segment=0.4, duration=10)
    cluster.start_workers(gpus=2)
    ids = cluster.submit(path)
    jitter = random.Random(os.getpid())
    cluster.wait_segments(ids[0], 3)
    time.sleep(jitter.uniform(0, 0.4))  # somewhere inside a segment
    kills = 0
    child = cluster.children("gpu0")
    os.kill(child[0], signal.SIGKILL)  # a worker's child, mid-segment
    kills += 1
    cluster.wait_segments(ids[1], 5)
    time.sleep(jitter.uniform(0, 0.4))
    os.kill(cluster.processes["gpu1"].pid, signal.SIGKILL)  # a worker's parent
    for pid in cluster.children("gpu1"):
        os.kill(pid, signal.SIGKILL)
    kills += 1
    cluster.start("gpu2", "worker", "--gpu", "2")  # a replacement GPU
    jobs = cluster.wait_done(ids)
    errors = [(j.job_id, j.last_error) for j in jobs if j.stage is not Stage.DONE]
    assert [j.stage for j in jobs] == [Stage.DONE] * 3, f"{errors}\n{cluster.logs()}"
    repeated = sum(n - 1 for j in ids for n in cluster.segment_counts(j).values())
    assert repeated <= kills
    assert any(e.event == "recovered" for j in ids for e in cluster.factory().jobs.events(j))
    # Bit-identical to an uninterrupted run of the same manifest, embedded.
    reference = tmp_path / "reference"
    assert run_cli("run", str(path), env=embedded_env(reference), timeout=600).returncode == 0
    for job in jobs:
        assert cluster.outputs(job) == output_digests(reference / "store", job)


def test_a_duplicate_segment_message_is_not_recomputed(cluster: Cluster, tmp_path: Path):
    path = manifest(tmp_path / "m.yaml", "dup", videos=1, seconds_per_segment=0.5, duration=6)
    cluster.start_workers(gpus=2, cpu=True)
    (job_id,) = cluster.submit(path)
    cluster.wait_segments(job_id, 2)
    machine = cluster.factory().jobs
    running = machine.get(job_id)
    # Re-deliver the message of the segment being made now (it claimed with attempt - 1).
    from tasks.celery_app import app
    from tasks.dispatch import headers

    app.conf.broker_url = BROKER
    app.send_task(
        "factory.generate_segment",
        args=[job_id, running.attempt - 1],
        queue="gpu",
        headers=headers(running),
    )
    (done,) = cluster.wait_done([job_id])
    assert done.stage is Stage.DONE
    assert set(cluster.segment_counts(job_id).values()) == {1}


def test_two_sweepers_claim_each_stale_job_once(cluster: Cluster, tmp_path: Path):
    path = manifest(tmp_path / "m.yaml", "stale", videos=6)
    env = {**cluster.env, "FACTORY_BROKER_URL": ""}  # submit without dispatching
    assert run_cli("submit", str(path), env=env).returncode == 0
    time.sleep(4.5)  # every job is now past FACTORY_STALE_AFTER=4 with no message anywhere
    sweepers = [
        subprocess.Popen(
            [sys.executable, "-m", "factory", "sweep"],
            cwd=REPO,
            env={**os.environ, **cluster.env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=60) for p in sweepers]
    assert all(p.returncode == 0 for p in sweepers), outputs
    machine: JobStateMachine = cluster.factory().jobs
    for i in range(6):
        events = machine.events(f"stale.v{i}")
        assert sum(e.event == "recovered" for e in events) == 1
    waiting = redis.Redis.from_url(BROKER).llen("gpu")
    assert waiting == 6  # one message per job, on the shared GPU queue
    # A third sweep leaves them alone: they are waiting for a GPU, not stale.
    time.sleep(4.5)
    third = run_cli("sweep", env=cluster.env)
    assert "resumed 0" in third.stdout, third.stdout


def no_job_lost_to_an_outage(
    own_servers: OwnServers,
    tmp_path: Path,
    batch: str,
    videos: int,
    after: int,
    outage: Callable[[], None],
    timeout: float = 240,
) -> None:
    """A batch of VIDEOS timed jobs on two GPU workers; once the first job has made AFTER
    segments, OUTAGE strikes the cluster's own servers; every job is done all the same."""
    cluster = own_servers.cluster
    path = manifest(tmp_path / "m.yaml", batch, videos=videos, seconds_per_segment=0.3, duration=8)
    cluster.start_workers(gpus=2)
    ids = cluster.submit(path)
    cluster.wait_segments(ids[0], after)
    outage()
    jobs = cluster.wait_done(ids, timeout=timeout)
    errors = [(j.job_id, j.last_error) for j in jobs if j.stage is not Stage.DONE]
    assert [j.stage for j in jobs] == [Stage.DONE] * videos, f"{errors}\n{cluster.logs()}"


def test_redis_flushall_mid_batch_loses_no_job(own_servers: OwnServers, tmp_path: Path):
    def flushall() -> None:
        redis.Redis.from_url(own_servers.redis.url()).flushall()

    no_job_lost_to_an_outage(own_servers, tmp_path, "flush", videos=3, after=3, outage=flushall)


def test_a_postgres_restart_mid_batch_loses_no_job(own_servers: OwnServers, tmp_path: Path):
    no_job_lost_to_an_outage(own_servers, tmp_path, "pgdown", videos=2, after=2,
                             outage=own_servers.postgres.restart, timeout=300)  # fmt: skip


def test_flower_answers_and_lists_the_workers_with_its_password_nowhere_in_sight(
    cluster: Cluster,
):
    cluster.start_workers(gpus=1, cpu=True, beat=False)
    password = "flower-" + uuid.uuid4().hex
    port = free_port()
    flower = cluster.start("flower", "flower", "--port", str(port),
                           extra_env={"FACTORY_FLOWER_BASIC_AUTH": f"ops:{password}"})  # fmt: skip
    deadline = time.monotonic() + 60
    names: set[str] = set()
    while time.monotonic() < deadline and len(names) < 2:
        try:
            answer = requests.get(
                f"http://127.0.0.1:{port}/api/workers?refresh=1", auth=("ops", password), timeout=10
            )
            if answer.ok:
                names = set(answer.json())
        except requests.ConnectionError:
            pass
        time.sleep(1)
    host = socket.gethostname()
    assert {f"gpu0@{host}", f"cpu@{host}"} <= names, cluster.logs()
    refused = requests.get(f"http://127.0.0.1:{port}/api/workers", timeout=10)
    assert refused.status_code == 401
    wrong = requests.get(f"http://127.0.0.1:{port}/api/workers", auth=("ops", "guess"), timeout=10)
    assert wrong.status_code == 401
    # `factory flower` execs Flower in place: the same pid, and its children if any
    cmdline = Path(f"/proc/{flower.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    assert "flower" in cmdline and f"--port={port}" in cmdline
    for pid in cluster.children("flower"):
        cmdline += Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    assert password not in cmdline and "basic-auth" not in cmdline
    assert password not in (cluster.home / "flower.log").read_text(errors="replace")


def test_a_redis_restart_mid_batch_loses_no_job(own_servers: OwnServers, tmp_path: Path):
    def restart() -> None:
        own_servers.redis.stop()  # killed: nothing saved, every connection cut
        time.sleep(1)
        own_servers.redis.start()  # back on the same port, empty

    no_job_lost_to_an_outage(own_servers, tmp_path, "rrestart", videos=2, after=2,
                             outage=restart, timeout=300)  # fmt: skip


def test_a_graceful_shutdown_hands_the_job_back_at_once(cluster: Cluster, tmp_path: Path):
    cluster.env_overrides = {"FACTORY_STALE_AFTER": "600"}  # the sweeper cannot be the rescuer
    path = manifest(tmp_path / "m.yaml", "leave", videos=1, seconds_per_segment=0.4, duration=10)
    cluster.start_workers(gpus=1)
    (job_id,) = cluster.submit(path)
    cluster.wait_segments(job_id, 3)
    os.kill(cluster.processes["gpu0"].pid, signal.SIGTERM)  # warm shutdown
    cluster.processes["gpu0"].wait(timeout=60)
    cluster.start("gpu1", "worker", "--gpu", "1")
    (job,) = cluster.wait_done([job_id], timeout=120)
    assert job.stage is Stage.DONE
    events = cluster.factory().jobs.events(job_id)
    assert not any(e.event == "recovered" for e in events)
    assert set(cluster.segment_counts(job_id).values()) == {1}
    claimers = {e.detail["worker"].split("/")[1] for e in events if e.event == "claimed"}
    assert f"gpu.{socket.gethostname()}.1" in claimers


def test_cancel_stops_the_worker_at_the_next_segment(cluster: Cluster, tmp_path: Path):
    # About 53 segments of 0.4 s: the cancel's own process (its start took long enough on a
    # loaded machine for all of a 12 s video's 16 to be made) lands well before the last.
    path = manifest(tmp_path / "m.yaml", "stop", videos=1, seconds_per_segment=0.4, duration=40)
    cluster.start_workers(gpus=1, cpu=False)
    (job_id,) = cluster.submit(path)
    cluster.wait_segments(job_id, 2)
    assert run_cli("cancel", job_id, env=cluster.env).returncode == 0
    time.sleep(2)
    machine = cluster.factory().jobs
    job = machine.get(job_id)
    assert job.stage is Stage.CANCELLED
    done_after = [e for e in machine.events(job_id) if e.event == "segment.done"]
    time.sleep(2)
    assert len([e for e in machine.events(job_id) if e.event == "segment.done"]) == len(done_after)
    assert len(done_after) < job.progress["segments_total"]


def test_json_logs_carry_the_job_and_its_trace_id(cluster: Cluster, tmp_path: Path):
    cluster.env_overrides = {"FACTORY_LOG_FORMAT": "json"}
    cluster.start_workers(gpus=1, cpu=True, beat=False)
    (job_id,) = cluster.submit(manifest(tmp_path / "m.yaml", "logs", videos=1, duration=3))
    (job,) = cluster.wait_done([job_id])
    records = []
    for line in (cluster.home / "gpu0.log").read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue  # Celery's start-up banner is plain text
    segment_lines = [r for r in records if r.get("message") == "segment.done"]
    assert segment_lines and all(r["job_id"] == job_id for r in segment_lines)
    assert {r["trace_id"] for r in segment_lines} == {job.trace_id}
    assert {e.trace_id for e in cluster.factory().jobs.events(job_id)} == {job.trace_id}


def test_requeue_sends_the_job_back_to_the_workers(cluster: Cluster, tmp_path: Path):
    cluster.env_overrides = {"FACTORY_STALE_AFTER": "600"}  # not the sweeper: the requeue sends it
    cluster.start_workers(gpus=1, cpu=True, beat=False)
    (job_id,) = cluster.submit(manifest(tmp_path / "m.yaml", "again", videos=1, duration=3))
    (job,) = cluster.wait_done([job_id])
    assert job.stage is Stage.DONE
    assert run_cli("requeue", job_id, "--from", "encode", env=cluster.env).returncode == 0
    (job,) = cluster.wait_done([job_id], timeout=120)
    assert job.stage is Stage.DONE
    events = [e.event for e in cluster.factory().jobs.events(job_id)]
    assert events.count("requeued") == 1 and events[-1] == "advanced"
    assert set(cluster.segment_counts(job_id).values()) == {1}  # generation was kept


def test_a_model_directory_only_gpu_nodes_see_is_checked_by_the_gpu_worker(
    cluster: Cluster, tmp_path: Path
):
    """Submitted from a host that does not see /models: a warning; the Celery GPU worker then
    checks the directory before the first segment and fails the job naming it."""
    elsewhere = "/gpu-nodes-only/SkyReels-V2-DF-1.3B"
    path = tmp_path / "m.yaml"
    path.write_text(
        "batch: remote\nvideos:\n  - id: v\n    duration: 4\n    fps: 8\n"
        "    resolution: 96x64\n    prompt: 'a harbor'\n"
        f"    model: {{family: skyreels-v2-df, path: {elsewhere}}}\n"
    )
    cluster.start_workers(gpus=1, cpu=False, beat=False)
    submitted = run_cli("submit", str(path), env=cluster.env)
    assert submitted.returncode == 0, submitted.stderr
    assert "is not visible from this host" in submitted.stderr
    (job,) = cluster.wait_done(submitted.stdout.split(), timeout=120)
    assert job.stage is Stage.FAILED and job.stopped_stage is Stage.GENERATE
    assert f"model directory {elsewhere} does not exist on this host" in job.last_error["message"]
    assert job.progress["segments"] == []
    assert cluster.segment_counts(job.job_id) == {}


def test_a_review_batch_waits_and_an_approval_is_delivered_by_the_workers(
    cluster: Cluster, tmp_path: Path
):
    """`review: required`: the workers stop after QC (the sweeper leaves the jobs alone, nothing
    is published); `factory approve` sends the delivery to the workers; `reject` keeps it off."""
    path = manifest(tmp_path / "m.yaml", "reviewed", videos=2)
    path.write_text(
        path.read_text().replace("batch: reviewed\n", "batch: reviewed\nreview: required\n")
    )
    cluster.start_workers(gpus=1)
    ids = cluster.submit(path)
    machine = cluster.factory().jobs
    deadline = time.monotonic() + 180
    while not all(machine.get(j).stage is Stage.REVIEW for j in ids):
        assert time.monotonic() < deadline, cluster.logs()
        time.sleep(0.3)
    time.sleep(3 * 1 + 4)  # past FACTORY_STALE_AFTER (4 s) with the sweeper every second
    assert [machine.get(j).stage for j in ids] == [Stage.REVIEW, Stage.REVIEW]
    assert not list((cluster.home / "store" / "reviewed").glob("*/out/*.mp4"))
    approved = run_cli("approve", ids[0], "--note", "fine", env=cluster.env)
    assert approved.returncode == 0, approved.stderr
    rejected = run_cli("reject", ids[1], "--reason", "a face melts at 0:02", env=cluster.env)
    assert rejected.returncode == 0, rejected.stderr
    done, sent_back = cluster.wait_done(ids)
    assert done.stage is Stage.DONE, cluster.logs()
    assert set(cluster.outputs(done)) == {"mobile.mp4", "compat.mp4"}
    events = machine.events(done.job_id)
    approval = next(e for e in events if e.event == "approved")
    assert approval.detail["actor"].startswith("cli:") and approval.detail["note"] == "fine"
    delivered_by = [
        e.detail["worker"] for e in events if e.event == "claimed" and e.id > approval.id
    ]
    assert delivered_by and "cpu" in delivered_by[0]  # a CPU worker delivered it
    assert not [e for e in events if e.event == "recovered"]  # the sweeper left it alone
    assert sent_back.stage is Stage.FAILED and sent_back.stopped_stage is Stage.REVIEW
    assert sent_back.last_error["kind"] == "Rejected"
    assert not (cluster.home / "store" / "reviewed" / "v1" / "out").exists()


def test_an_ffmpeg_failure_on_a_worker_keeps_its_command_and_return_code(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The Celery path records a failure as the embedded one does (one engine): a mux whose
    bed went bad in the store after submit fails with the ffmpeg command and its code."""
    from factory.media.ffmpeg import ffmpeg_exe

    bed = tmp_path / "sea.flac"
    subprocess.run([ffmpeg_exe(), "-v", "error", "-f", "lavfi", "-i",
                    "sine=frequency=330:duration=3", "-c:a", "flac", str(bed)],
                   check=True)  # fmt: skip
    assert run_cli("store", "put", str(bed), "beds/sea.flac", env=cluster.env).returncode == 0
    [job_id] = cluster.submit(manifest(tmp_path / "m.yaml", "badbed", 1, audio="beds/sea.flac"))
    (cluster.home / "store" / "beds" / "sea.flac").write_bytes(b"fLaC" + os.urandom(4096))
    cluster.start_workers(gpus=1)
    [job] = cluster.wait_done([job_id], timeout=240)
    assert job.stage is Stage.FAILED and job.stopped_stage is Stage.MUX, cluster.logs()
    error = job.last_error or {}
    assert "ffmpeg" in error.get("command", ""), error
    assert isinstance(error.get("returncode"), int) and error["returncode"] != 0, error
    failed = [e for e in cluster.factory().jobs.events(job_id) if e.event == "failed"]
    assert failed and failed[-1].detail.get("command") == error["command"]
