"""Webhook alerts to a real local HTTP server: a job's failure and the batch's completion
with its summary, retried with backoff, sent once, never carrying secrets."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from factory.db.state import JobStateMachine
from factory.infra.alerts import Alerter, WebhookSettings
from factory.media.ffmpeg import ffmpeg_exe, run
from tests.conftest import embedded_env, run_cli

TOKEN = "whk-test-token-8c1d5e"
AWS_SECRET = "aws-secret-for-alert-test-Q7x"


class Receiver:
    def __init__(self, answers: list[int]) -> None:
        self.answers = answers  # status codes to answer with, in turn; then 200
        self.requests: list[tuple[dict[str, str], bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append((dict(self.headers), body))
                status = receiver.answers.pop(0) if receiver.answers else 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/factory"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def payloads(self) -> list[dict]:
        return [json.loads(body) for _, body in self.requests]


def write_manifest(path: Path, head: str, duration: int, videos: list[str]) -> Path:
    """HEAD (the batch, its review), then VIDEOS (each a flow mapping's inside) at 8 fps,
    96x64, in segments of 8 frames overlapping by 2, delivered as the mobile rendition."""
    defaults = (
        f"{{duration: {duration}, fps: 8, resolution: 96x64, "
        "segment: {frames: 8, overlap: 2}, renditions: [mobile]}"
    )
    listed = "".join(f"  - {{{video}}}\n" for video in videos)
    path.write_text(f"{head}\ndefaults: {defaults}\nvideos:\n{listed}")
    return path


def spoil_once_under_way(
    store: Path, key: str, started: Path
) -> tuple[threading.Event, threading.Event]:
    """Watches, in the background, for the first file under STARTED (in the store: `factory
    run` is past its submit, so the bed was checked there and found good), then replaces the
    object KEY in the store, in one rename, by bytes that are not audio: the job naming it
    meets them only in mux. Returns (replaced, stop): set once replaced; set it to stop
    watching."""
    replaced, stop = threading.Event(), threading.Event()
    target = store / key

    def watch() -> None:
        while not stop.wait(0.01):
            if started.is_dir() and any(started.iterdir()):
                spoiled = target.with_name(f".{target.name}.spoiled")  # hidden from listings
                spoiled.write_bytes(b"this is not a flac file" * 100)
                os.replace(spoiled, target)
                replaced.set()
                return

    threading.Thread(target=watch, daemon=True).start()
    return replaced, stop


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    made = Receiver([503])  # the first delivery attempt fails
    yield made
    made.server.shutdown()


def test_failure_and_batch_completion_alerts(tmp_path: Path, receiver: Receiver) -> None:
    videos = ["id: ok, prompt: 'a harbor'",
              "id: broken, prompt: 'a forest', audio: {asset: beds/sea.flac}"]  # fmt: skip
    manifest = write_manifest(tmp_path / "m.yaml", "batch: alerting", 3, videos)
    bed = tmp_path / "sea.flac"  # real audio: submit fetches and decodes it, and accepts it
    run([ffmpeg_exe(), "-v", "error", "-f", "lavfi", "-i", "sine=frequency=330:duration=3",
         "-c:a", "flac", str(bed)])  # fmt: skip
    home = tmp_path / "home"
    env = {
        **embedded_env(home),
        "FACTORY_WEBHOOK_URL": receiver.url,
        "FACTORY_WEBHOOK_TOKEN": TOKEN,
        "FACTORY_WEBHOOK_BACKOFF": "0.1",
        "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
    }
    assert run_cli("store", "put", str(bed), "beds/sea.flac", env=env).returncode == 0
    # The bed goes bad in the store after submit checked it: once the first job (ok) has a
    # segment in the store, well before the second (broken) reaches mux, which then fails.
    store = home / "store"
    replaced, stop = spoil_once_under_way(store, "beds/sea.flac", store / "alerting" / "ok")
    try:
        done = run_cli("run", str(manifest), env=env, timeout=300)
    finally:
        stop.set()
    assert replaced.is_set(), done.stdout + done.stderr  # spoiled while the run was under way
    assert done.returncode == 1, done.stdout + done.stderr  # one job failed
    events = [p["event"] for p in receiver.payloads()]
    assert events == ["job.failed", "job.failed", "batch.completed"]  # first one retried
    failed, _, completed = receiver.payloads()
    assert failed["job_id"] == "alerting.broken" and failed["stage"] == "mux"
    assert "FAILED in mux" in failed["text"]
    summary = completed["summary"]
    assert (summary["delivered"], summary["failed"], summary["jobs"]) == (1, 1, 2)
    assert summary["qc"] == {"passed": 1, "failed": 0, "not_run": 1}
    assert summary["gpu_hours"] > 0 and summary["failures"][0]["job_id"] == "alerting.broken"
    assert "mobile" in summary["outputs"]["alerting.ok"]
    assert "1 delivered, 1 failed" in completed["text"]
    for headers, body in receiver.requests:
        assert headers["Authorization"] == f"Bearer {TOKEN}"
        assert TOKEN.encode() not in body and AWS_SECRET.encode() not in body
        assert headers["Content-Type"] == "application/json"

    # The bed put right again (the next run's submit checks it): cron firing twice leaves the
    # failed job failed until it is requeued, and announces the batch no second time.
    assert run_cli("store", "put", str(bed), "beds/sea.flac", env=env).returncode == 0
    again = run_cli("run", str(manifest), env=env, timeout=300)
    assert again.returncode == 1, again.stdout + again.stderr
    assert [p["event"] for p in receiver.payloads()].count("batch.completed") == 1


def test_refusals_are_not_retried_and_outages_give_up_quietly(tmp_path: Path) -> None:
    refusing = Receiver([400, 400, 400])
    pauses: list[float] = []
    try:
        settings = WebhookSettings(url=refusing.url, attempts=3, backoff=0.5)
        alerter = Alerter(settings, JobStateMachine.__new__(JobStateMachine), pauses.append)
        assert alerter.send({"event": "test", "text": "x"}) is False
        assert len(refusing.requests) == 1 and pauses == []
    finally:
        refusing.server.shutdown()
    gone = WebhookSettings(url="http://127.0.0.1:9/nothing", attempts=4, backoff=0.5)
    alerter = Alerter(gone, JobStateMachine.__new__(JobStateMachine), pauses.append)
    assert alerter.send({"event": "test", "text": "x"}) is False
    assert pauses == [0.5, 1.0, 2.0]  # backoff doubles between the four attempts


def test_a_redirect_is_not_followed_so_the_token_goes_nowhere_else() -> None:
    class Redirecting(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(307)
            self.send_header("Location", elsewhere.url)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    elsewhere = Receiver([])
    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        settings = WebhookSettings(url=url, token=TOKEN, attempts=3, backoff=0.1)
        alerter = Alerter(settings, JobStateMachine.__new__(JobStateMachine), lambda _: None)
        assert alerter.send({"event": "test", "text": "x"}) is False
        assert elsewhere.requests == []  # neither the alert nor the token reached the other host
    finally:
        server.shutdown()
        elsewhere.server.shutdown()


def test_a_batch_waiting_for_review_is_announced_once(tmp_path: Path, receiver: Receiver) -> None:
    videos = ["id: a, prompt: 'a harbor'", "id: b, prompt: 'a forest'"]
    manifest = write_manifest(tmp_path / "m.yaml", "batch: reviewing\nreview: required", 2, videos)
    env = {**embedded_env(tmp_path / "home"), "FACTORY_WEBHOOK_URL": receiver.url,
           "FACTORY_WEBHOOK_BACKOFF": "0.1"}  # fmt: skip
    done = run_cli("run", str(manifest), env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "0 of 2 videos delivered" in done.stdout
        and "2 passed QC and wait for review" in done.stdout
    )
    waiting = [p for p in receiver.payloads() if p["event"] == "batch.review_waiting"]
    assert len(waiting) == 2 and waiting[0] == waiting[1]  # one alert; answered 503 once
    assert waiting[0]["waiting"] == ["reviewing.a", "reviewing.b"]
    assert "wait for review" in waiting[0]["text"]
    assert run_cli("run", str(manifest), env=env, timeout=300).returncode == 0  # cron again
    assert [p["event"] for p in receiver.payloads()].count("batch.review_waiting") == 2
    assert run_cli("approve", "reviewing.a", env=env).returncode == 0
    assert run_cli("approve", "reviewing.b", env=env).returncode == 0
    completed = [p for p in receiver.payloads() if p["event"] == "batch.completed"]
    assert len(completed) == 1 and completed[0]["summary"]["delivered"] == 2
