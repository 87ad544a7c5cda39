"""The cluster-facing commands as a user runs them (no workers needed)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.conftest import REPO, embedded_env, manifest_text, run_cli
from tests.integration.cluster import BROKER


def embedded(tmp_path: Path) -> dict[str, str]:
    return embedded_env(tmp_path / "home")


def test_workers_need_a_broker(tmp_path: Path):
    for args in (["worker", "--cpu"], ["beat"], ["sweep"]):
        result = run_cli(*args, env=embedded(tmp_path))
        assert result.returncode == 2 and "FACTORY_BROKER_URL" in result.stderr


def test_worker_needs_exactly_one_kind(tmp_path: Path):
    env = {**embedded(tmp_path), "FACTORY_BROKER_URL": BROKER}
    result = run_cli("worker", "--gpu", "0", "--cpu", env=env)
    assert result.returncode == 2
    assert "exactly one of --gpu N, --gpus auto or --cpu" in result.stderr


def _worker(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """`factory worker ARGS` in a process whose CUDA_VISIBLE_DEVICES is env's alone."""
    full = {k: v for k, v in os.environ.items()
            if k not in ("CUDA_VISIBLE_DEVICES", "FACTORY_WORKER_ALLOW_CPU")} | env  # fmt: skip
    return subprocess.run([os.sys.executable, "-m", "factory", "worker", *args], env=full,
                          capture_output=True, text=True, timeout=60, cwd=REPO)  # fmt: skip


def test_a_gpu_worker_never_asks_for_a_gpu_it_cannot_see(tmp_path: Path):
    """--gpu N is this process's view: CUDA_VISIBLE_DEVICES=0 (set by a unit, a scheduler or
    a runtime) has one GPU, and a container given one card sees it as GPU 0 (nvidia-smi)."""
    env = {**embedded(tmp_path), "FACTORY_BROKER_URL": BROKER}
    refused = _worker({**env, "CUDA_VISIBLE_DEVICES": "0"}, "--gpu", "1")
    assert refused.returncode == 2, refused.stderr
    assert "--gpu 1: GPU 1 is not visible here" in refused.stderr
    assert "CUDA_VISIBLE_DEVICES='0'" in refused.stderr and "exec " not in refused.stderr
    one_card = tmp_path / "nvidia-smi"
    one_card.write_text("#!/bin/sh\necho '0, GPU-5e1c, NVIDIA H200, 00000000:9A:00.0, 143771'\n")
    one_card.chmod(0o755)
    container = _worker({**env, "FACTORY_NVIDIA_SMI": str(one_card)}, "--gpu", "1")
    assert container.returncode == 2, container.stderr
    assert "nvidia-smi lists 1 GPU(s) here: 0" in container.stderr
    assert "that card is --gpu 0" in container.stderr


def test_a_gpu_worker_without_a_gpu_runs_on_the_cpu_only_when_told(tmp_path: Path):
    env = {**embedded(tmp_path), "FACTORY_BROKER_URL": BROKER,
           "FACTORY_NVIDIA_SMI": str(tmp_path / "absent")}  # fmt: skip
    refused = _worker(env, "--gpu", "0")
    assert refused.returncode == 2, refused.stderr
    assert "no GPU is visible here" in refused.stderr and "--allow-cpu" in refused.stderr
    for allowed in (_worker(env, "--gpu", "0", "--allow-cpu", "--loglevel", "nonsense"),
                    _worker({**env, "FACTORY_WORKER_ALLOW_CPU": "1"}, "--gpu", "0",
                            "--loglevel", "nonsense")):  # fmt: skip
        # Past the check: the worker says it runs on the CPU, then Celery starts (and stops
        # at once here, on the log level it cannot use).
        assert "running the GPU stages on the CPU" in allowed.stderr, allowed.stderr
        assert "exec " in allowed.stderr


def test_flower_refuses_to_start_without_auth(tmp_path: Path):
    env = {
        **embedded(tmp_path),
        "FACTORY_BROKER_URL": BROKER,
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
        "FACTORY_ENV_FILE": str(tmp_path / "factory.env"),  # present, empty: the env above
    }
    (tmp_path / "factory.env").write_text("")
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
