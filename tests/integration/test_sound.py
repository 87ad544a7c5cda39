"""Sound (issue 38, item 3), through the whole embedded pipeline with real ffmpeg: cues mixed
over the bed land where the manifest says (found by cross-correlation in every delivered
rendition's decoded audio, within one AAC frame), a cue past the end is cut there, the track
is brought to its loudness target (integrated within ±1 LU, true peak under the ceiling, in
every rendition, measured by ffmpeg's ebur128), qc.json and quality.png show it, and the gate
fails a track made 6 LU too loud. Bad sound input is refused at submit naming the field."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import av
import numpy as np
import pytest

from factory.media.ffmpeg import ffmpeg_exe
from factory.media.presets import PRESETS
from factory.media.sound import measure_loudness
from factory.pipeline import files
from factory.pipeline.runner import run_job
from factory.stages import Stage
from factory.store import keys
from tests.conftest import run_cli_here
from tests.integration.test_pipeline import home_env, in_process

RATE = 48000
CUES = ((1.25, "chirp.wav", 0.0), (3.5, "sweep.wav", -3.0), (5.8, "chirp.wav", 0.0))


def make_sounds(folder: Path) -> None:
    """A bed of brown noise (quiet, 2 s, looped to length) and two cues whose waveforms
    correlate sharply: rising and falling sweeps."""
    exe = ffmpeg_exe()
    commands = {
        "bed.wav": "anoisesrc=d=2:c=brown:r=44100:a=0.05",
        "chirp.wav": "aevalsrc='0.6*sin(2*PI*(400*t+6000*t*t))':d=0.3:s=44100",
        "sweep.wav": "aevalsrc='0.6*sin(2*PI*(3000*t-2500*t*t))':d=0.4:s=22050",
    }
    for name, source in commands.items():
        subprocess.run([exe, "-v", "error", "-y", "-f", "lavfi", "-i", source, str(folder / name)],
                       check=True)  # fmt: skip


def manifest(folder: Path, loudness: str = "{integrated: -16, true_peak: -1}") -> Path:
    cues = ", ".join(f"{{at: {at}, asset: ./{name}, gain_db: {gain}}}" for at, name, gain in CUES)
    path = folder / "m.yaml"
    path.write_text(
        "batch: sound\nvideos:\n  - id: v\n    duration: 6\n    fps: 12\n"
        "    resolution: 128x72\n    segment: {frames: 24, overlap: 4}\n"
        "    renditions: [mobile, compat]\n    prompt: a harbor at dawn\n"
        f"    audio: {{asset: ./bed.wav, gain_db: -6, cues: [{cues}], loudness: {loudness}}}\n"
    )
    return path


def decoded_audio(path: Path) -> np.ndarray:
    """The first audio stream, mono, float, at 48 kHz (as the mux wrote it)."""
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        assert stream.sample_rate == RATE
        chunks = [frame.to_ndarray() for frame in container.decode(stream)]
    samples = np.concatenate(chunks, axis=1)  # planar float: channels x samples
    return samples.mean(axis=0)


def cue_waveform(path: Path) -> np.ndarray:
    with av.open(str(path)) as container:
        resampler = av.AudioResampler(format="flt", layout="mono", rate=RATE)
        out = []
        for frame in container.decode(audio=0):
            out += [f.to_ndarray()[0] for f in resampler.resample(frame)]
        out += [f.to_ndarray()[0] for f in resampler.resample(None)]
    return np.concatenate(out)


def found_at(track: np.ndarray, cue: np.ndarray, near: float) -> float:
    """Where `cue` starts in `track` (seconds), by cross-correlation within ±0.2 s of `near`."""
    lo = max(0, round((near - 0.2) * RATE))
    window = track[lo : round((near + 0.2) * RATE) + len(cue)]
    cue = cue[: max(1, len(window) - round(0.4 * RATE))]  # (the end may be cut off)
    size = 1 << int(np.ceil(np.log2(len(window) + len(cue))))
    spectrum = np.fft.rfft(window, size) * np.conj(np.fft.rfft(cue, size))
    correlation = np.fft.irfft(spectrum, size)[: len(window) - len(cue) + 1]
    return (lo + int(np.argmax(correlation))) / RATE


def test_cues_land_on_time_and_the_track_meets_its_loudness(tmp_path: Path):
    make_sounds(tmp_path)
    env = home_env(tmp_path / "home")
    done = run_cli_here("run", str(manifest(tmp_path)), env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    _, ctx = in_process(tmp_path / "home")
    job = ctx.machine.get("sound.v")
    assert job.stage is Stage.DONE, job.last_error
    report = json.loads(ctx.store.path(keys.qc_report("sound", "v")).read_text())
    assert report["passed"], report["failures"]
    waves = {name: cue_waveform(tmp_path / name) for name in ("chirp.wav", "sweep.wav")}
    frame = 1024 / RATE  # one AAC frame
    for rendition in job.video.renditions:
        out = ctx.store.path(keys.output("sound", "v", rendition))
        loudness = report["renditions"][rendition]["loudness"]
        # Brought to -16 LUFS within ±1 LU, its true peak under -1 dBTP, as ebur128 measures
        # the delivered file (measured here again, independently of the gate's figures).
        measured = measure_loudness(out)
        assert abs(measured.integrated - -16) <= 1, measured
        assert measured.true_peak <= -1, measured
        assert abs(loudness["integrated"] - measured.integrated) < 0.05
        checks = {c["name"]: c for c in report["renditions"][rendition]["checks"]}
        assert checks["loudness_integrated"]["passed"] and checks["true_peak"]["passed"]
        track = decoded_audio(out)
        assert abs(len(track) / RATE - 6.0) <= frame  # cut at the video's end
        for at, name, _ in CUES:
            start = found_at(track, waves[name], at)
            assert abs(start - at) <= frame, (rendition, name, at, start)
    plot = ctx.store.path(job.progress["qc"]["pictures"]["quality"])
    assert plot.stat().st_size > 0

    # The same delivered track made 6 LU too loud: the gate fails it, naming the check.
    loud = tmp_path / "loud.mp4"
    for rendition in job.video.renditions:
        key = files.muxed(job, rendition)
        source = ctx.store.path(key)
        subprocess.run([ffmpeg_exe(), "-v", "error", "-y", "-i", str(source), "-map", "0",
                        "-c:v", "copy", "-af", "volume=6dB", "-c:a", "aac", "-b:a", "160k",
                        "-tag:v", "hvc1" if PRESETS[rendition].is_hevc else "avc1",
                        "-f", "mp4", str(loud)], check=True)  # fmt: skip
        ctx.store.put_file(key, loud)
    requeued = ctx.machine.requeue("sound.v", from_stage=Stage.QC, actor="test")
    failed = run_job(ctx, requeued.job_id, worker="t")
    assert failed.stage is Stage.FAILED and failed.stopped_stage is Stage.QC
    message = failed.last_error["message"]
    assert "loudness_integrated" in message and "LU from the -16 LUFS target" in message
    status = run_cli_here("status", "sound.v", env=env).stdout
    assert "LU from the -16 LUFS target" in status


def test_a_delivery_profile_sets_the_target(tmp_path: Path):
    make_sounds(tmp_path)
    env = home_env(tmp_path / "home")
    done = run_cli_here("run", str(manifest(tmp_path, "broadcast")), env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    _, ctx = in_process(tmp_path / "home")
    report = json.loads(ctx.store.path(keys.qc_report("sound", "v")).read_text())
    for rendition in ("mobile", "compat"):
        loudness = report["renditions"][rendition]["loudness"]
        assert loudness["target"] == -23 and loudness["ceiling"] == -1
        assert abs(loudness["integrated"] - -23) <= 1 and loudness["true_peak"] <= -1


@pytest.mark.parametrize(
    ("change", "field", "said"),
    [
        (("at: 5.8", "at: 6.5"), "videos[0].audio.cues[2].at", "is not inside the video"),
        (("./sweep.wav", "./missing.wav"), "videos[0].audio.cues[1].asset", "does not exist"),
        (("./sweep.wav", "./m.yaml"), "videos[0].audio.cues[1].asset", "is not a sound file"),
        (
            ("{integrated: -16, true_peak: -1}", "{true_peak: -1}"),
            "videos[0].audio.loudness",
            "give a profile",
        ),
        (
            ("{integrated: -16, true_peak: -1}", "loud"),
            "videos[0].audio.loudness.profile",
            "streaming",
        ),
    ],
)
def test_bad_sound_is_refused_at_submit_naming_the_field(tmp_path: Path, change, field, said):
    make_sounds(tmp_path)
    path = manifest(tmp_path)
    path.write_text(path.read_text().replace(*change))
    env = home_env(tmp_path / "home")
    refused = run_cli_here("submit", str(path), env=env)
    assert refused.returncode == 2, refused.stderr
    assert f"{field}: " in refused.stderr and said in refused.stderr, refused.stderr
    assert "no job" in run_cli_here("status", "sound.v", env=env).stderr
