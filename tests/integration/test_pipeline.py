"""The pipeline with real ffmpeg, on the embedded defaults, as `factory run` runs it."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from factory.config import Settings
from factory.errors import MediaError, NoSuchJob
from factory.infra.confinement import Confinement
from factory.manifest import load_manifest, parse_manifest
from factory.media.ffmpeg import ffmpeg_exe, run
from factory.media.presets import PRESETS
from factory.media.probe import probe
from factory.ops import preflight
from factory.ops.submit import submit
from factory.pipeline import files
from factory.pipeline.context import StageContext
from factory.pipeline.encode import run_encode
from factory.pipeline.files import Segments
from factory.pipeline.generate import run_generate
from factory.pipeline.mux import run_mux
from factory.pipeline.runner import run_job
from factory.plan.video import video_plan
from factory.stages import Stage
from factory.store import keys
from factory.store.file import FileStore
from factory.wiring import Factory
from tests.conftest import REPO, run_cli_here
from tests.conftest import embedded_env as home_env

BEDS = REPO / "examples" / "assets"


def in_process(home: Path) -> tuple[Factory, StageContext]:
    settings = Settings.from_env(home_env(home))
    factory = Factory.open(settings)
    return factory, StageContext.from_settings(settings, factory.jobs, factory.database)


def write_manifest(path: Path, body: str) -> Path:
    path.write_text(body)
    return path


def test_quick_batch_end_to_end(tmp_path: Path):
    """The README's example as it is, on a fresh home: its beds come from beside the manifest."""
    env = home_env(tmp_path / "home")
    done = run_cli_here("run", str(REPO / "examples" / "quick.yaml"), env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "2 of 2 videos delivered" in done.stdout
    manifest = load_manifest(REPO / "examples" / "quick.yaml")
    store = FileStore(tmp_path / "home" / "store")
    for video in manifest.videos:
        for rendition in video.renditions:
            facts = probe(store.path(keys.output(video.batch, video.video_id, rendition)))
            preset = PRESETS[rendition]
            v, a = facts.video, facts.audio
            assert v is not None and a is not None
            assert v.codec == ("hevc" if preset.is_hevc else "h264")
            assert v.codec_tag == ("hvc1" if preset.is_hevc else "avc1")
            assert (v.width, v.height) == (320, 192)  # capped: never upscaled
            assert v.frames == video.frames_total
            assert abs(v.duration - video.frames_total / video.fps) < 1e-3
            assert v.max_gop_seconds <= 2.0 and v.open_keyframes == 0
            assert a.codec == "aac" and abs(v.start - a.start) <= 0.042
            assert abs(v.duration - a.duration) <= 0.042
        report = json.loads(store.path(keys.qc_report(video.batch, video.video_id)).read_text())
        assert report["schema"] == "factory.qc/2" and report["passed"] is True
        for rendition in video.renditions:
            fidelity = report["renditions"][rendition]["fidelity"]
            assert fidelity["vmaf"]["mean"] >= 82 and fidelity["psnr_y"]["mean"] >= 38
        assert len(report["seams"]) == len(video_plan(video)) - 1
        for picture in ("contact", "quality"):
            png = store.path(f"{video.batch}/{video.video_id}/{picture}.png").read_bytes()
            assert png[:4] == b"\x89PNG"
        status = json.loads(run_cli_here("status", video.job_id, "--json", env=env).stdout)
        assert status["stage"] == "done"
        outputs = set(status["outputs"])
        assert outputs == {*video.renditions, "qc", "contact", "quality"}
    again = run_cli_here("run", str(REPO / "examples" / "quick.yaml"), env=env)
    assert again.returncode == 0 and "2 of 2 videos delivered" in again.stdout


def test_same_spec_gives_identical_intermediates(tmp_path: Path):
    digests = []
    for name in ("a", "b"):
        factory, ctx = in_process(tmp_path / name)
        store = ctx.store
        quick = load_manifest(REPO / "examples" / "quick.yaml")
        checked = preflight.check(quick, lambda s=store: s, confinement=Confinement())
        preflight.upload(checked, store)
        manifest = checked.manifest
        job = submit(manifest, factory.jobs, None).jobs[0]
        job = factory.jobs.claim(job.job_id, seen_attempt=job.attempt, worker="t")
        run_generate(ctx, job)
        files = sorted((tmp_path / name / "store" / "quick" / "harbor" / "segments").iterdir())
        digests.append({f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files})
    assert len(digests[0]) == 7  # 4 segments, 3 tails
    assert digests[0] == digests[1]


TIMED = """
batch: crash
videos:
  - id: slow
    prompt: "a slow pan over a harbor"
    duration: 6
    fps: 8
    resolution: 160x96
    segment: {frames: 8, overlap: 2}
    renditions: [compat]
    model: {family: timed, seconds_per_segment: 0.6}
"""


def wait_for_segments(home: Path, job_id: str, count: int, timeout: float = 60) -> int:
    factory = Factory.open(Settings.from_env(home_env(home)))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            done = len(factory.jobs.get(job_id).progress["segments"])
        except NoSuchJob:  # not submitted yet
            done = 0
        if done >= count:
            return done
        time.sleep(0.05)
    raise AssertionError(f"{job_id} did not reach {count} segments")


def run_under_way(
    tmp_path: Path, segments: int
) -> tuple[Path, dict[str, str], Path, subprocess.Popen]:
    """`factory run` of TIMED (job crash.slow) in a fresh home below TMP_PATH, started in the
    background and left running once SEGMENTS segments are recorded: the home, its env, the
    manifest and the process."""
    home = tmp_path / "home"
    env = home_env(home)
    manifest = write_manifest(tmp_path / "crash.yaml", TIMED)
    proc = subprocess.Popen([sys.executable, "-m", "factory", "run", str(manifest)],
                            env={**os.environ, **env}, cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    wait_for_segments(home, "crash.slow", segments)
    return home, env, manifest, proc


def test_a_writer_killed_mid_segment_costs_only_that_segment(tmp_path: Path):
    home, env, manifest, proc = run_under_way(tmp_path, 3)
    time.sleep(0.3)  # well inside the next segment
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    factory, _ = in_process(home)
    job = factory.jobs.get("crash.slow")
    recorded = job.progress["segments"]
    assert job.stage is Stage.GENERATE and recorded == list(range(len(recorded)))
    assert len(recorded) < job.progress["segments_total"]
    stored = sorted((home / "store" / "crash" / "slow" / "segments").glob("*.mkv"))
    # Nothing beyond the recorded segments counts as done; at most the one being written
    # may have reached the store just before its checkpoint.
    assert len(recorded) <= len(stored) <= len(recorded) + 1
    resumed = run_cli_here("run", str(manifest), env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    events = json.loads(run_cli_here("events", "crash.slow", "--json", env=env).stdout)
    segments = Counter(e["detail"]["segment"] for e in events if e["event"] == "segment.done")
    assert set(segments.values()) == {1}  # no finished segment was generated twice
    assert sorted(segments) == list(range(job.progress["segments_total"]))


def test_cancel_stops_the_run_at_the_next_checkpoint(tmp_path: Path):
    home, env, _, proc = run_under_way(tmp_path, 2)
    cancelled = run_cli_here("cancel", "crash.slow", "--reason", "wrong prompt", env=env)
    assert cancelled.returncode == 0, cancelled.stderr
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1, stderr
    factory, _ = in_process(home)
    job = factory.jobs.get("crash.slow")
    assert job.stage is Stage.CANCELLED
    assert len(job.progress["segments"]) < job.progress["segments_total"]


def test_missing_audio_asset_is_refused_before_any_job_exists(tmp_path: Path):
    env = home_env(tmp_path / "home")
    manifest = write_manifest(
        tmp_path / "m.yaml",
        TIMED.replace("seconds_per_segment: 0.6", "seconds_per_segment: 0.01")
        + "    audio: {asset: beds/late.ogg}\n",
    )
    refused = run_cli_here("run", str(manifest), env=env, timeout=300)
    assert refused.returncode == 2, refused.stderr
    assert "videos[0].audio.asset: beds/late.ogg does not exist in the store" in refused.stderr
    assert "factory store put" in refused.stderr
    assert "no job" in run_cli_here("status", "crash.slow", env=env).stderr


def test_asset_gone_after_submit_fails_in_mux_and_requeue_continues(tmp_path: Path):
    home = tmp_path / "home"
    env = home_env(home)
    manifest = write_manifest(
        tmp_path / "m.yaml",
        TIMED.replace("seconds_per_segment: 0.6", "seconds_per_segment: 0.01")
        + "    audio: {asset: beds/late.ogg}\n",
    )
    bed = BEDS / "calm-bed.ogg"
    assert run_cli_here("store", "put", str(bed), "beds/late.ogg", env=env).returncode == 0
    assert run_cli_here("submit", str(manifest), env=env).returncode == 0
    (home / "store" / "beds" / "late.ogg").unlink()  # removed from the store after submit
    _, ctx = in_process(home)
    failed = run_job(ctx, "crash.slow", worker="t")
    assert failed.stage is Stage.FAILED
    status = run_cli_here("status", "crash.slow", env=env).stdout
    assert "failed (in mux)" in status and "beds/late.ogg" in status
    assert "factory store put" in status
    assert (
        run_cli_here(
            "store", "put", str(BEDS / "calm-bed.ogg"), "beds/late.ogg", env=env
        ).returncode
        == 0
    )
    requeued = json.loads(run_cli_here("requeue", "crash.slow", "--json", env=env).stdout)
    assert requeued["stage"] == "mux" and requeued["progress"]["encode"]["joined"]
    assert run_job(ctx, "crash.slow", worker="t").stage is Stage.DONE
    events = json.loads(run_cli_here("events", "crash.slow", "--json", env=env).stdout)
    total = requeued["progress"]["segments_total"]
    assert sum(e["event"] == "segment.done" for e in events) == total  # none regenerated


def test_a_failed_check_stops_delivery(tmp_path: Path):
    home = tmp_path / "home"
    factory, ctx = in_process(home)
    manifest = load_manifest(
        write_manifest(
            tmp_path / "m.yaml",
            TIMED.replace("seconds_per_segment: 0.6", "seconds_per_segment: 0.01"),
        )
    )
    job = submit(manifest, factory.jobs, None).jobs[0]
    job = factory.jobs.claim(job.job_id, seen_attempt=job.attempt, worker="t")
    for stage in (run_generate, run_encode, run_mux):
        job = stage(ctx, job)
    assert job.stage is Stage.QC
    # Break one rendition for real: the same file with its audio track dropped.
    muxed = ctx.store.path(files.muxed(job, "compat"))
    broken = tmp_path / "broken.mp4"
    run([ffmpeg_exe(), "-y", "-loglevel", "error", "-i", str(muxed), "-map", "0:v", "-c", "copy",
         str(broken)])  # fmt: skip
    ctx.store.put_file(files.muxed(job, "compat"), broken)
    job = run_job(ctx, job.job_id, worker="t")
    assert job.stage is Stage.FAILED and job.stopped_stage is Stage.QC
    assert "compat.audio_stream: no audio stream" in job.last_error["message"]
    assert not list(ctx.store.list("crash/slow/out"))
    assert ctx.store.exists(job.progress["qc"]["report"])
    assert job.progress["qc"]["report"] == f"crash/slow/work/a{job.attempt}/qc.json"


def test_ffmpeg_failure_carries_command_and_stderr(tmp_path: Path):
    with pytest.raises(MediaError) as caught:
        run([ffmpeg_exe(), "-hide_banner", "-i", str(tmp_path / "missing.mkv"), "-f", "null", "-"])
    assert caught.value.returncode != 0
    assert "missing.mkv" in caught.value.stderr_tail and caught.value.argv[0] == ffmpeg_exe()


def test_drift_control_pulls_later_segments_toward_the_first(tmp_path: Path):
    import numpy as np

    from factory.media.intermediate import read_frames
    from factory.media.stitch import channel_stats
    from factory.pipeline.generate import generate_segment
    from factory.qc.thresholds import QcThresholds

    text = TIMED.replace("seconds_per_segment: 0.6", "seconds_per_segment: 0.001").replace(
        'prompt: "a slow pan over a harbor"',
        "scenes: [{start: 0, prompt: 'a harbor'}, {start: 1, prompt: 'a city at night'}]",
    )
    gaps = {}
    for factor in (0.0, 1.0):
        factory, ctx = in_process(tmp_path / f"f{factor}")
        ctx.drift_factor = factor
        ctx.qc = QcThresholds(seam_jump=100)  # factor 1 across a scene change is a hard jump
        job = submit(parse_manifest(text), factory.jobs, None).jobs[0]
        job = factory.jobs.claim(job.job_id, seen_attempt=job.attempt, worker="t")
        warm = None
        for _ in range(6):
            job, warm = generate_segment(ctx, job, warm)
        anchor = np.array(job.progress["anchor"]["mean"])
        last = read_frames(ctx.store.path(Segments.load(factory.jobs, job).segment(5)), 160, 96)
        gaps[factor] = float(np.abs(channel_stats(last)[0] - anchor).mean())
    assert gaps[1.0] < gaps[0.0] / 2, gaps
