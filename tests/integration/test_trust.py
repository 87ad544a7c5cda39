"""Trustworthy under operators and faults (issue 14), with real Celery workers, Redis,
PostgreSQL and ffmpeg: a requeue never delivers stale video, a superseded worker never
touches committed data, a lasting fault ends in a failure and an alert, the sweeper finds a
crashed job behind a backlog, stale CPU links are dropped, clocks may be skewed."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import threading
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import psycopg2
import pytest
import redis

from factory.config import Settings
from factory.db.session import Database
from factory.db.state import JobStateMachine
from factory.media.intermediate import read_frames
from factory.pipeline.files import Segments
from factory.stages import Stage
from factory.store.file import FileStore
from tests.conftest import PG_ADMIN_DSN, run_cli
from tests.integration.cluster import BROKER, Cluster, manifest
from tests.integration.test_alerts import Receiver

CLOCK_SKEW = Path(__file__).resolve().parent.parent / "clock_skew"  # sitecustomize.py


def decoded(path: Path, width: int, height: int) -> np.ndarray:
    return read_frames(path, width, height).astype(np.float32)


def psnr(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per frame, in dB."""
    mse = ((a - b) ** 2).reshape(len(a), -1).mean(axis=1)
    return 10 * np.log10(255.0**2 / np.maximum(mse, 1e-6))


def segments_video(store: FileStore, made: Segments, width: int, height: int) -> np.ndarray:
    """The frames the job's recorded segments write, in order (the lossless truth)."""
    from factory.plan.video import video_plan

    job = made.job
    parts = [
        read_frames(store.path(made.segment(p.index)), width, height)[: p.write_count]
        for p in video_plan(job.video)
    ]
    return np.concatenate(parts).astype(np.float32)


def delivered(cluster: Cluster, job, rendition: str = "compat") -> np.ndarray:
    """The job's published rendition (its current version's) scaled back to the job's size,
    decoded frame by frame."""
    from factory.media.ffmpeg import ffmpeg_exe, run
    from factory.store import keys

    key = keys.output(job.batch, job.video_id, rendition, job.version)
    out = cluster.home / "store" / key
    small = cluster.home / f"{job.video_id}-{rendition}-{job.attempt}.mkv"
    width, height = job.spec["width"], job.spec["height"]
    run([ffmpeg_exe(), "-y", "-v", "error", "-i", str(out), "-vf", f"scale={width}:{height}",
         "-c:v", "ffv1", str(small)])  # fmt: skip
    return decoded(small, width, height)


def test_a_requeue_delivers_what_was_redone_never_stale_video(cluster: Cluster, tmp_path: Path):
    cluster.env_overrides = {"FACTORY_STALE_AFTER": "600"}  # the requeues send the work
    cluster.start_workers(gpus=1, cpu=True, beat=False)
    path = manifest(tmp_path / "m.yaml", "redo", videos=1, duration=6)
    (job_id,) = cluster.submit(path)
    (first,) = cluster.wait_done([job_id])
    assert first.stage is Stage.DONE, cluster.logs()
    store = FileStore(cluster.home / "store")
    width, height = first.spec["width"], first.spec["height"]
    machine = cluster.factory().jobs
    first_made = Segments.load(machine, first)
    old_truth = segments_video(store, first_made, width, height)
    assert psnr(delivered(cluster, first), old_truth).min() > 30

    # --from encode: a chunk left in the store by the earlier run (here: made from other
    # frames) must not be joined again; the chunks are encoded anew from the segments.
    from factory.pipeline.chunks import chunk_key
    from factory.plan.chunks import plan_chunks

    chunk = plan_chunks(first.video)[0]
    recorded_chunk = store.path(chunk_key(first_made, chunk, "compat"))
    recorded_chunk.write_bytes(
        (cluster.home / "store" / "redo" / "v0" / "out" / "mobile.mp4").read_bytes()
    )
    assert run_cli("requeue", job_id, "--from", "encode", env=cluster.env).returncode == 0
    (second,) = cluster.wait_done([job_id])
    assert second.stage is Stage.DONE, cluster.logs()
    assert psnr(delivered(cluster, second), old_truth).min() > 30

    # --from generate with a changed setting: new segments, and the delivery is made of them.
    cluster.stop()
    cluster.env_overrides = {**cluster.env_overrides, "FACTORY_DRIFT_FACTOR": "1"}
    cluster.start_workers(gpus=1, cpu=True, beat=False)
    assert run_cli("requeue", job_id, "--from", "generate", env=cluster.env).returncode == 0
    (third,) = cluster.wait_done([job_id])
    assert third.stage is Stage.DONE, cluster.logs()
    third_made = Segments.load(machine, third)
    new_truth = segments_video(store, third_made, width, height)
    changed = np.abs(new_truth - old_truth).reshape(len(new_truth), -1).mean(axis=1) > 2
    assert changed.sum() >= len(changed) // 3, "the changed setting changed too little"
    now = delivered(cluster, third)
    assert psnr(now, new_truth).min() > 30
    # Frame by frame, where the segments changed, the delivery follows the new ones.
    closer = psnr(now, new_truth)[changed] - psnr(now, old_truth)[changed]
    assert (closer > 0).all() and closer.mean() > 3, closer
    # Derived files of the first run are not what QC and delivery used.
    assert third.progress["qc"]["report"] != first.progress["qc"]["report"]
    assert third.progress["mux"]["muxed"] != first.progress["mux"]["muxed"]
    for index in range(third.progress["segments_total"]):
        assert third_made.segment(index) != first_made.segment(index)


def committed_objects(read: dict[str, bytes]) -> dict[str, str]:
    return {key: hashlib.sha256(body).hexdigest() for key, body in read.items()}


def _fenced_out_worker_scenario(cluster: Cluster, tmp_path: Path, read_all) -> None:
    """A GPU worker frozen mid-segment (SIGSTOP: a GC pause, a VM stall) loses its job to a
    cancel + requeue; the other worker commits the job; the frozen one is let go."""
    host = socket.gethostname()
    path = manifest(tmp_path / "m.yaml", "fence", 1, seconds_per_segment=1.5, duration=5)
    cluster.start_workers(gpus=1, cpu=True, beat=True)
    (job_id,) = cluster.submit(path)
    machine = cluster.factory().jobs
    cluster.wait_segments(job_id, 1)
    time.sleep(0.3)  # inside segment 1 now
    holder = machine.get(job_id)
    assert f"gpu.{host}.0" in (holder.claimed_by or ""), holder.claimed_by
    (frozen,) = cluster.children("gpu0")
    os.kill(frozen, signal.SIGSTOP)
    try:
        assert run_cli("cancel", job_id, env=cluster.env).returncode == 0
        cluster.start("gpu1", "worker", "--gpu", "1")
        cluster.wait_for_workers(3)
        assert run_cli("requeue", job_id, env=cluster.env).returncode == 0
        (done,) = cluster.wait_done([job_id], timeout=180)
        assert done.stage is Stage.DONE, cluster.logs()
        before = committed_objects(read_all())
        made = Segments.load(machine, done)
        recorded = {made.segment(i) for i in range(done.progress["segments_total"])}
        assert recorded <= set(before)
    finally:
        os.kill(frozen, signal.SIGCONT)
    # The frozen worker wakes up holding segment 1 of an attempt that is long gone.
    deadline = time.monotonic() + 30
    log = cluster.home / "gpu0.log"
    while time.monotonic() < deadline and b"segment.stopped" not in log.read_bytes():
        time.sleep(0.2)
    time.sleep(2)
    after = committed_objects(read_all())
    changed = {k for k in before if after.get(k) != before[k]}
    assert not changed, f"committed objects changed or deleted: {sorted(changed)}"
    assert machine.get(job_id).stage is Stage.DONE
    assert b"segment.stopped" in log.read_bytes(), cluster.logs()


def test_a_fenced_out_worker_cannot_touch_committed_files(cluster: Cluster, tmp_path: Path):
    root = cluster.home / "store"

    def read_all() -> dict[str, bytes]:
        return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*")
                if p.is_file() and not p.name.startswith(".")}  # fmt: skip

    _fenced_out_worker_scenario(cluster, tmp_path, read_all)


def test_a_fenced_out_worker_cannot_touch_committed_objects_on_s3(
    cluster: Cluster, tmp_path: Path, s3_stand, bucket: str
):
    cluster.env_overrides = s3_stand.env(f"s3://{bucket}/factory")
    client = s3_stand.direct_client()

    def read_all() -> dict[str, bytes]:
        listed = client.list_objects_v2(Bucket=bucket, Prefix="factory/").get("Contents", [])
        return {o["Key"][len("factory/") :]: client.get_object(Bucket=bucket, Key=o["Key"])[
            "Body"].read() for o in listed}  # fmt: skip

    _fenced_out_worker_scenario(cluster, tmp_path, read_all)


def test_a_failing_heartbeat_stops_the_task(cluster: Cluster, tmp_path: Path):
    """A failover: the database turns read-only (psycopg2's InternalError on every write).
    The heartbeat cannot be written; after half of FACTORY_STALE_AFTER the task stops,
    before the sweeper gives the job to someone else; the job is then recovered."""
    path = manifest(tmp_path / "m.yaml", "beatfail", 1, seconds_per_segment=6, duration=4)
    cluster.env_overrides = {"FACTORY_STALE_AFTER": "4", "FACTORY_HEARTBEAT_EVERY": "1"}
    cluster.start_workers(gpus=1, cpu=True, beat=False)
    (job_id,) = cluster.submit(path)
    machine = cluster.factory().jobs
    deadline = time.monotonic() + 60
    while machine.get(job_id).stage is not Stage.GENERATE and time.monotonic() < deadline:
        time.sleep(0.1)
    name = cluster.database_url.rsplit("/", 1)[-1]
    admin = psycopg2.connect(PG_ADMIN_DSN)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
        cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> pg_backend_pid()", (name,))  # fmt: skip
    log = cluster.home / "gpu0.log"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and b"segment.stopped" not in log.read_bytes():
            time.sleep(0.2)
        text = log.read_text(errors="replace")
        assert "heartbeat.failed" in text and "read-only" in text, text[-3000:]
        assert "segment.stopped" in text, text[-3000:]
    finally:
        with admin.cursor() as cur:
            cur.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
            cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = %s AND pid <> pg_backend_pid()", (name,))  # fmt: skip
        admin.close()
    stopped_at = log.read_text(errors="replace").index("segment.stopped")
    assert "could not be written" in log.read_text(errors="replace")[stopped_at - 2000 :]
    cluster.start("beat", "beat")  # the sweeper recovers the job that stopped
    (job,) = cluster.wait_done([job_id], timeout=120)
    assert job.stage is Stage.DONE, cluster.logs()
    assert set(cluster.segment_counts(job_id).values()) == {1}


def test_an_endless_fault_fails_the_job_with_an_alert(cluster: Cluster, tmp_path: Path):
    """A store that never answers: interrupted, resumed, interrupted… until
    FACTORY_GIVE_UP_AFTER passes without progress; then failed, with the advice, alerted."""
    receiver = Receiver([])
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # a port nobody listens on
    port = closed.getsockname()[1]
    try:
        cluster.env_overrides = {
            "FACTORY_STORE_URL": "s3://never/factory",
            "FACTORY_S3_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "FACTORY_S3_ATTEMPTS": "1",
            "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y",
            "FACTORY_STALE_AFTER": "3", "FACTORY_HEARTBEAT_EVERY": "1",
            "FACTORY_GIVE_UP_AFTER": "5",
            "FACTORY_WEBHOOK_URL": receiver.url,
        }  # fmt: skip
        cluster.start_workers(gpus=1, cpu=False, beat=True)
        (job_id,) = cluster.submit(manifest(tmp_path / "m.yaml", "endless", 1, duration=3))
        (job,) = cluster.wait_done([job_id], timeout=120)
        # The batch's summary is sent after the job's alert, by the process that settled it:
        # wait for it before the receiver stops (a full suite once stopped it in between).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(
            p.get("event") == "batch.completed" for p in receiver.payloads()
        ):
            time.sleep(0.2)
    finally:
        closed.close()
        receiver.server.shutdown()
    assert job.stage is Stage.FAILED, cluster.logs()
    assert job.last_error["kind"] == "NoProgress"
    assert job.last_error["fault"] == "RetryableError"
    assert "cannot reach the S3 endpoint" in job.last_error["message"]
    assert "FACTORY_GIVE_UP_AFTER" in job.last_error["message"]
    events = cluster.factory().jobs.events(job_id)
    assert sum(e.event == "interrupted" for e in events) >= 2
    alerts = [p for p in receiver.payloads() if p.get("event") == "job.failed"]
    assert [a["job_id"] for a in alerts] == [job_id], receiver.payloads()  # once, by the worker
    completed = [p for p in receiver.payloads() if p.get("event") == "batch.completed"]
    assert len(completed) == 1 and completed[0]["summary"]["failed"] == 1
    status = run_cli("status", job_id, env=cluster.env)
    assert "NoProgress" in status.stdout and "requeue" in status.stdout


def test_a_long_outage_passes_and_a_fault_that_never_heals_fails(
    machine: JobStateMachine, batch_name: str
):
    """Time driven by the test: a 20-minute outage (interruptions every 5 minutes, then
    progress) with the default bound of an hour passes; an endless one fails after the bound;
    progress in between starts the count again."""
    from tests.integration.test_state_machine import job_at

    job = job_at(machine, batch_name, Stage.GENERATE)
    start = job.heartbeat_at
    clock = {"now": start}
    timed = JobStateMachine(machine.database, clock=lambda: clock["now"])

    def interrupt_at(minutes: float):
        clock["now"] = start + timedelta(minutes=minutes)
        current = timed.get(job.job_id)
        held = timed.claim(job.job_id, seen_attempt=current.attempt, worker="w")
        return timed.interrupt(job.job_id, attempt=held.attempt, reason="gateway down",
                               give_up_after=3600, advice="check the gateway")  # fmt: skip

    for minute in (0, 5, 10, 15, 20):
        assert interrupt_at(minute).stage is Stage.GENERATE
    clock["now"] = start + timedelta(minutes=21)
    held = timed.claim(job.job_id, seen_attempt=timed.get(job.job_id).attempt, worker="w")
    resumed = timed.checkpoint(job.job_id, attempt=held.attempt, updates={"frame": 8})
    assert "interrupted" not in resumed.progress and resumed.recoveries == 0
    # The same fault again, for good: it fails once an hour has passed without progress.
    for minute in range(25, 85, 5):
        assert interrupt_at(minute).stage is Stage.GENERATE
    failed = interrupt_at(86)
    assert failed.stage is Stage.FAILED and failed.last_error["kind"] == "NoProgress"
    assert "check the gateway" in failed.last_error["message"]
    assert timed.requeue(job.job_id).stage is Stage.GENERATE  # the operator continues it


def test_the_sweeper_finds_a_crashed_job_behind_200_waiting_ones(cluster: Cluster, tmp_path: Path):
    """A backlog of 200 jobs waiting for a GPU (two manifests, each sharing one created_at)
    and one job whose GPU worker died (its message taken, its heartbeat old)."""
    env = cluster.env
    for part in range(2):
        lines = [f"batch: wait{part}", "defaults: {duration: 2, fps: 8, resolution: 96x64, "
                 "segment: {frames: 8, overlap: 2}, renditions: [mobile]}", "videos:"]  # fmt: skip
        lines += [f"  - {{id: v{i:03d}, prompt: 'p {i}'}}" for i in range(100)]
        (tmp_path / f"w{part}.yaml").write_text("\n".join(lines) + "\n")
        assert run_cli("submit", str(tmp_path / f"w{part}.yaml"), env=env).returncode == 0
    (crashed_id,) = cluster.submit(manifest(tmp_path / "c.yaml", "crash", 1, duration=2))
    broker = redis.Redis.from_url(BROKER)
    from tasks.broker import advancing, messages

    for raw, headers in list(messages(broker, "gpu")):
        if (advancing(raw, headers) or ("",))[0] == crashed_id:
            broker.lrem("gpu", 1, raw)  # the dead worker took this message
    machine = cluster.factory().jobs
    held = machine.claim(crashed_id, seen_attempt=0, worker="gpu-9/gpu.dead.0/pid-1")
    machine.transition(crashed_id, attempt=held.attempt, to=Stage.GENERATE)
    assert broker.llen("gpu") == 200
    time.sleep(4.5)  # past FACTORY_STALE_AFTER=4: every one of them is a candidate
    sweeps = 0
    while sweeps < 2 and machine.get(crashed_id).claimed_by == held.claimed_by:
        done = run_cli("sweep", env=env)
        assert done.returncode == 0, done.stderr
        sweeps += 1
    recovered = [e for e in machine.events(crashed_id) if e.event == "recovered"]
    assert recovered, f"not recovered in {sweeps} sweeps"
    waiting_recovered = [
        j.job_id
        for j in machine.list_jobs(stage=Stage.QUEUED)
        if any(e.event == "recovered" for e in machine.events(j.job_id))
    ]
    assert not waiting_recovered


def test_a_duplicate_cpu_link_is_dropped(cluster: Cluster, tmp_path: Path):
    cluster.env_overrides = {"FACTORY_STALE_AFTER": "600"}
    cluster.start_workers(gpus=1, cpu=False, beat=False)
    (job_id,) = cluster.submit(manifest(tmp_path / "m.yaml", "dupcpu", 1, duration=3))
    machine = cluster.factory().jobs
    deadline = time.monotonic() + 60
    while machine.get(job_id).stage is not Stage.ENCODE and time.monotonic() < deadline:
        time.sleep(0.1)
    # The chain's first link waits in `cpu`. A CPU worker takes it (here: the test, holding
    # the job as a live worker would); the same link delivered again must not take it away.
    job = machine.get(job_id)
    live = machine.claim(job_id, seen_attempt=job.attempt, worker="cpu-node/cpu/pid-7")
    assert redis.Redis.from_url(BROKER).llen("cpu") >= 1
    cluster.start("cpu", "worker", "--cpu")
    deadline = time.monotonic() + 60
    events = []
    while time.monotonic() < deadline:
        events = [e for e in machine.events(job_id) if e.event == "message.dropped"]
        if events:
            break
        time.sleep(0.2)
    assert events and events[0].detail["stage"] == "encode", cluster.logs()
    after = machine.get(job_id)
    assert after.attempt == live.attempt and after.claimed_by == "cpu-node/cpu/pid-7"
    assert after.stage is Stage.ENCODE


def test_clock_skew_of_ten_minutes_neither_kills_nor_hides_a_job(cluster: Cluster, tmp_path: Path):
    def skewed(seconds: int) -> dict[str, str]:
        path = os.pathsep.join(filter(None, [str(CLOCK_SKEW), os.environ.get("PYTHONPATH")]))
        return {"PYTHONPATH": path, "FACTORY_TEST_CLOCK_SKEW": str(seconds)}

    path = manifest(tmp_path / "m.yaml", "skew", 1, seconds_per_segment=0.4, duration=10)
    # The GPU worker's clock is 10 minutes behind, the sweeper's 10 minutes ahead.
    cluster.start("gpu0", "worker", "--gpu", "0", extra_env=skewed(-600))
    cluster.start("cpu", "worker", "--cpu", extra_env=skewed(600))
    cluster.start("beat", "beat", extra_env=skewed(600))
    cluster.wait_for_workers(2)
    (job_id,) = cluster.submit(path)
    cluster.wait_segments(job_id, 4)
    os.killpg(cluster.processes["gpu0"].pid, signal.SIGKILL)  # now it is dead for real
    cluster.start("gpu1", "worker", "--gpu", "1", extra_env=skewed(600))
    (job,) = cluster.wait_done([job_id], timeout=180)
    assert job.stage is Stage.DONE, cluster.logs()
    events = cluster.factory().jobs.events(job_id)
    recovered = [e for e in events if e.event == "recovered"]
    assert len(recovered) == 1, [(e.event, e.detail) for e in events]  # the dead one only
    killed_at = next(e.at for e in events if e.event == "segment.done" and e.detail["segment"] == 3)
    assert recovered[0].at > killed_at
    assert recovered[0].detail["silent_seconds"] < 60  # not the ten minutes of skew


def test_a_frozen_lock_holder_cannot_block_cancel_for_ever(pg_url: str, tmp_path: Path):
    """A worker frozen inside a transaction, holding the job's row lock: the server ends its
    session after FACTORY_DB_IDLE_TIMEOUT, and the operator's cancel goes through."""
    from factory.db import migrate
    from tests.integration.test_state_machine import job_at

    migrate.upgrade(Database(pg_url))
    settings = Settings.from_env({"FACTORY_DATABASE_URL": pg_url, "FACTORY_HOME": str(tmp_path),
                                  "FACTORY_DB_IDLE_TIMEOUT": "2",
                                  "FACTORY_DB_STATEMENT_TIMEOUT": "30"})  # fmt: skip
    database = Database(pg_url, statement_timeout=settings.db_statement_timeout,
                        idle_timeout=settings.db_idle_timeout)  # fmt: skip
    machine = JobStateMachine(database)
    job = job_at(machine, "frozen", Stage.GENERATE)
    frozen = database.engine.connect()
    transaction = frozen.begin()
    frozen.exec_driver_sql("SELECT 1 FROM jobs WHERE job_id = %s FOR UPDATE", (job.job_id,))
    result: dict[str, object] = {}

    def cancel() -> None:
        result["job"] = machine.cancel(job.job_id, reason="operator")

    worker = threading.Thread(target=cancel, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "cancel is still blocked by the frozen lock holder"
    assert result["job"].stage is Stage.CANCELLED  # type: ignore[attr-defined]
    with pytest.raises(Exception):  # noqa: B017 - the server ended that session
        frozen.exec_driver_sql("SELECT 1")
    transaction.close() if transaction.is_active else None
    frozen.invalidate()
    database.dispose()
