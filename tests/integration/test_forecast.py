"""`factory forecast` and `factory watch --window` against a history recorded by real runs."""

from __future__ import annotations

import json
import statistics
from datetime import datetime, timedelta
from pathlib import Path

from factory.config import Settings
from factory.wiring import Factory
from tests.conftest import embedded_env, run_cli_here


def manifest(path: Path, batch: str, videos: int, *, family: str = "procedural",
             resolution: str = "96x64", duration: float = 6) -> Path:  # fmt: skip
    lines = [f"batch: {batch}", "defaults:", f"  duration: {duration}", "  fps: 8",
             f"  resolution: {resolution}", "  segment: {frames: 8, overlap: 2}",
             "  renditions: [mobile]", f"  model: {family}", "videos:"]  # fmt: skip
    lines += [f"  - {{id: v{i}, prompt: 'scene {i}'}}" for i in range(videos)]
    path.write_text("\n".join(lines) + "\n")
    return path


def window_around_now(minutes_left: int) -> str:
    now = datetime.now().astimezone()
    start, end = now - timedelta(minutes=1), now + timedelta(minutes=minutes_left)
    return f"{start:%H:%M}-{end:%H:%M}"


def test_forecast_from_recorded_history(tmp_path: Path) -> None:
    env = embedded_env(tmp_path / "home")
    ran = run_cli_here(
        "run", str(manifest(tmp_path / "r.yaml", "recorded", 2)), env=env, timeout=300
    )
    assert ran.returncode == 0, ran.stderr
    factory = Factory.open(Settings.from_env(env))
    recorded = [e.detail["seconds"] for job in factory.jobs.list_jobs()
                for e in factory.jobs.events(job.job_id)
                if e.event == "segment.done" and e.detail["segment_frames"] == 8]  # fmt: skip

    tonight = manifest(tmp_path / "t.yaml", "tonight", 3)
    done = run_cli_here("forecast", str(tonight), "--gpus", "2", "--json", env=env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    first = result["videos"][0]
    assert first["seconds_per_segment"] == round(statistics.median(recorded), 3)
    assert first["basis"] == f"history: median of {len(recorded)} segments"
    assert first["segments"] == 8  # 48 frames in segments of 8 with 2 of overlap
    assert result["cpu_basis"].startswith("history:") and result["fits"] is None
    assert {v["gpu"] for v in result["videos"]} == {0, 1}

    bigger = manifest(tmp_path / "b.yaml", "bigger", 1, resolution="192x128")
    scaled = json.loads(run_cli_here("forecast", str(bigger), "--json", env=env).stdout)
    assert "scaled" in scaled["videos"][0]["basis"]

    text = run_cli_here("forecast", str(tonight), "--window", window_around_now(120), env=env)
    assert text.returncode == 0 and "fits:" in text.stdout, text.stdout + text.stderr

    slow = manifest(tmp_path / "s.yaml", "slow", 4,
                    family="{family: timed, seconds_per_segment: 400}")  # fmt: skip
    late = run_cli_here("forecast", str(slow), "--window", window_around_now(60), env=env)
    assert late.returncode == 3, late.stdout + late.stderr
    assert "does NOT fit" in late.stdout and "GPUs would make it fit" in late.stdout
    as_json = json.loads(
        run_cli_here(
            "forecast", str(slow), "--window", window_around_now(60), "--json", env=env
        ).stdout
    )
    assert as_json["fits"] is False and as_json["gpus_needed"] == 4  # 3200 s each, ~1 h left
    endless = manifest(tmp_path / "e.yaml", "endless", 1, duration=20,
                       family="{family: timed, seconds_per_segment: 400}")  # fmt: skip
    never = run_cli_here("forecast", str(endless), "--window", window_around_now(60), env=env)
    assert never.returncode == 3 and "no number of GPUs helps" in never.stdout

    watched = run_cli_here("watch", "--once", "--window", window_around_now(60), env=env)
    assert watched.returncode == 0, watched.stderr
    assert "batch ETA" in watched.stdout and "on time" in watched.stdout


def test_a_bad_window_names_the_option(tmp_path: Path) -> None:
    env = embedded_env(tmp_path / "home")
    done = run_cli_here("forecast", str(manifest(tmp_path / "m.yaml", "w", 1)), "--window", "late",
                   env=env)  # fmt: skip
    assert done.returncode == 2 and "--window: must be HH:MM-HH:MM" in done.stderr
