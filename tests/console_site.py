"""A real console for tests: batches made by a real `factory run` on PostgreSQL, tokens made
by `factory token create`, and `factory serve` running as its own process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from tests.conftest import REPO, embedded_env, run_cli
from tests.s3stand import free_port

# Prompts with markup: the console must show them as text.
MARKUP = "<script>window.__xss = 1</script> & <b>bold</b> harbor"
REVIEW_VIDEOS = ("api-ok", "api-no", "web-ok", "web-no", "seen")


def review_manifest(batch: str) -> str:
    lines = [
        f"batch: {batch}",
        "review: required",
        "defaults: {duration: 4, fps: 12, resolution: 160x96, segment: {frames: 16, overlap: 4},"
        " renditions: [mobile, compat]}",
        "videos:",
    ]
    for i, name in enumerate(REVIEW_VIDEOS):
        prompt = MARKUP if name == "seen" else f"a harbor at dawn, take {i}"
        lines.append(f"  - id: {name}")
        lines.append(f"    prompt: '{prompt}'")
    return "\n".join(lines) + "\n"


PLAIN_MANIFEST = (
    "batch: plain\ndefaults: {duration: 2, fps: 12, resolution: 160x96, "
    "segment: {frames: 16, overlap: 4}, renditions: [mobile]}\n"
    "videos:\n  - {id: one, prompt: 'a forest'}\n  - {id: two, prompt: 'a desert road'}\n"
)


ROLES = ("viewer", "operator", "admin")


@dataclass
class Site:
    base: str
    env: dict[str, str]
    home: Path
    tokens: dict[str, str] = field(default_factory=dict)  # role -> secret
    process: subprocess.Popen | None = None

    def api(self, role: str | None) -> requests.Session:
        session = requests.Session()
        if role:
            session.headers["Authorization"] = f"Bearer {self.tokens[role]}"
        return session

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return run_cli(*args, env=self.env)

    def store_path(self, key: str) -> Path:
        return self.home / "store" / key


def start_server(env: dict[str, str], home: Path) -> tuple[str, subprocess.Popen]:
    port = free_port()
    log = open(home / "serve.log", "ab")  # noqa: SIM115 - lives as long as the process
    process = subprocess.Popen(
        [sys.executable, "-m", "factory", "serve", "--port", str(port)],
        cwd=REPO,
        env={**os.environ, **env},
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if requests.get(base + "/healthz", timeout=1).status_code == 200:
                return base, process
        except requests.ConnectionError:
            pass
        if process.poll() is not None:
            break
        time.sleep(0.2)
    process.kill()
    raise AssertionError("factory serve did not start:\n" + (home / "serve.log").read_text())


def make_site(home: Path, database_url: str, extra_env: dict[str, str] | None = None) -> Site:
    # As behind the gateway: the tests' own loopback is the one proxy whose X-Forwarded-* count.
    env = {**embedded_env(home), "FACTORY_DATABASE_URL": database_url,
           "FACTORY_CONSOLE_TRUSTED_PROXIES": "127.0.0.1", **(extra_env or {})}  # fmt: skip
    upgraded = run_cli("db", "upgrade", env=env)
    assert upgraded.returncode == 0, upgraded.stderr
    (home / "review.yaml").write_text(review_manifest("nightly"))
    (home / "plain.yaml").write_text(PLAIN_MANIFEST)
    made = run_cli("run", str(home / "review.yaml"), env=env, timeout=600)
    assert made.returncode == 0, made.stdout + made.stderr
    assert "wait for review" in made.stdout
    made = run_cli("run", str(home / "plain.yaml"), env=env, timeout=600)
    assert made.returncode == 0, made.stdout + made.stderr
    return serve_site(env, home, "test")


def serve_site(env: dict[str, str], home: Path, name: str, roles: tuple[str, ...] = ROLES) -> Site:
    """A `factory serve` on ``home`` with a token per role (named ``name-role``)."""
    site = Site("", env, home)
    for role in roles:
        created = run_cli("token", "create", f"{name}-{role}", "--role", role, env=env)
        assert created.returncode == 0, created.stderr
        site.tokens[role] = created.stdout.strip()
    site.base, site.process = start_server(env, home)
    return site


def stop_site(site: Site) -> None:
    if site.process is not None:
        site.process.terminate()
        try:
            site.process.wait(10)
        except subprocess.TimeoutExpired:
            site.process.kill()


def settled(site: Site, job_id: str, *, seconds: float = 120) -> dict:
    """The job once nothing is left to run for it (done, failed, cancelled, or waiting for
    review): without a broker the server's own runner runs what it accepts, in the background."""
    viewer = site.api("viewer")
    deadline = time.monotonic() + seconds
    while True:
        job = viewer.get(f"{site.base}/api/v1/jobs/{job_id}").json()
        if job["stage"] in ("done", "failed", "cancelled", "review"):
            return job
        if time.monotonic() > deadline:
            log = (site.home / "serve.log").read_text()
            raise AssertionError(f"{job_id} is still {job['stage']} after {seconds} s\n{log}")
        time.sleep(0.25)
