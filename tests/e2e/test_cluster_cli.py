"""The cluster-facing commands as a user runs them (no workers needed)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.conftest import REPO, embedded_env, manifest_text, run_cli


def embedded(tmp_path: Path) -> dict[str, str]:
    return embedded_env(tmp_path / "home")


def test_workers_need_a_broker(tmp_path: Path):
    for args in (["worker", "--cpu"], ["beat"], ["sweep"]):
        result = run_cli(*args, env=embedded(tmp_path))
        assert result.returncode == 2 and "FACTORY_BROKER_URL" in result.stderr


def test_worker_needs_exactly_one_kind(tmp_path: Path):
    env = {**embedded(tmp_path), "FACTORY_BROKER_URL": "redis://127.0.0.1:6379/12"}
    result = run_cli("worker", "--gpu", "0", "--cpu", env=env)
    assert result.returncode == 2
    assert "exactly one of --gpu N, --gpus auto or --cpu" in result.stderr


def test_flower_refuses_to_start_without_auth(tmp_path: Path):
    env = {
        **embedded(tmp_path),
        "FACTORY_BROKER_URL": "redis://127.0.0.1:6379/12",
        "FACTORY_FLOWER_BASIC_AUTH": "",
    }
    result = run_cli("flower", env=env)
    assert result.returncode == 2 and "FACTORY_FLOWER_BASIC_AUTH" in result.stderr
    on_argv = run_cli("flower", "--basic-auth", "ops:pw-on-the-command-line", env=env)
    assert on_argv.returncode == 2  # no such option: a password never goes on a command line
    half = run_cli("flower", env={**env, "FACTORY_FLOWER_BASIC_AUTH": "ops-only"})
    assert half.returncode == 2 and "user:password" in half.stderr


def test_watch_once_shows_progress_and_eta(tmp_path: Path):
    env = embedded(tmp_path)
    manifest = tmp_path / "m.yaml"
    manifest.write_text(manifest_text("w", videos=2, duration=2))
    assert run_cli("run", str(manifest), env=env, timeout=300).returncode == 0
    assert run_cli("requeue", "w.v01", "--from", "generate", env=env).returncode == 0
    snapshot = run_cli("watch", "w", "--once", env=env).stdout
    assert "w.v00" in snapshot and "done" in snapshot and "3/3" in snapshot
    assert "w.v01" in snapshot and "0/3" in snapshot
    assert "1 done, 0 failed or cancelled, 1 in progress" in snapshot


def test_nightly_script_is_harmless_when_cron_fires_twice(tmp_path: Path):
    env = {
        **os.environ,
        **embedded(tmp_path),
        "FACTORY_CLI": str(Path(os.sys.executable).parent / "factory"),
    }
    manifest = tmp_path / "nightly.yaml"
    manifest.write_text(manifest_text("ignored", videos=3))
    runs = [
        subprocess.run(
            ["bash", str(REPO / "scripts" / "nightly.sh"), str(manifest)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        for _ in range(2)
    ]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr
    assert "3 created, 0 already submitted" in runs[0].stderr
    assert "0 created, 3 already submitted" in runs[1].stderr
    listed = json.loads(run_cli("jobs", "--json", env=embedded(tmp_path)).stdout)
    assert len(listed) == 3 and all(j["batch"].startswith("nightly-") for j in listed)


def test_submit_with_the_broker_away_keeps_the_jobs(tmp_path: Path):
    env = {**embedded(tmp_path), "FACTORY_BROKER_URL": "redis://127.0.0.1:1/0"}
    manifest = tmp_path / "m.yaml"
    manifest.write_text(manifest_text("away", videos=2))
    result = run_cli("submit", str(manifest), env=env)
    assert result.returncode == 0 and "not dispatched" in result.stderr
    assert "the sweeper sends them" in result.stderr
    assert len(json.loads(run_cli("jobs", "--json", env=env).stdout)) == 2
