"""Audio: one AAC track over the whole video (a bed looped or padded to length, or silence),
encoded once and muxed with ``-c:v copy``. Per-chunk AAC would add ~21 ms of priming at
every joint; encoding once after joining avoids it.
"""

from __future__ import annotations

from pathlib import Path

import ffmpeg

from factory.media.ffmpeg import QUIET
from factory.media.identify import ffmpeg_input

SAMPLE_RATE = 48000
BITRATE = "160k"


def audio_argv(
    exe: str,
    source: Path | None,
    duration: float,
    output: Path,
    *,
    gain_db: float = 0.0,
    loop: bool = True,
) -> list[str]:
    """AAC in MP4 of exactly ``duration`` seconds from ``source`` (or silence if None)."""
    if source is None:
        stream = ffmpeg.input(f"anullsrc=r={SAMPLE_RATE}:cl=stereo", f="lavfi").audio
        opened: list[str] = []
    else:
        # The bed as identify opens it (its one demuxer, `file` only), spliced in below.
        opened = ffmpeg_input(source, "sound", loop=loop)
        stream = ffmpeg.input(str(source)).audio
        stream = stream.filter("volume", f"{gain_db:g}dB")
        if not loop:
            stream = stream.filter("apad")  # a short bed ends in silence
    out = ffmpeg.output(
        stream, str(output), t=f"{duration:.6f}", acodec="aac", audio_bitrate=BITRATE,
        ar=SAMPLE_RATE, ac=2, f="mp4",
    )  # fmt: skip
    argv = out.compile(cmd=exe)
    if opened:
        at = argv.index("-i")
        argv[at : at + 2] = opened
    return [argv[0], *QUIET, *argv[1:]]


def mux_argv(exe: str, video: Path, audio: Path, output: Path, *, hevc: bool) -> list[str]:
    return [
        exe, *QUIET,
        "-i", str(video), "-i", str(audio),
        "-map", "0:v:0", "-map", "1:a:0", "-c:v", "copy", "-c:a", "copy",
        "-tag:v", "hvc1" if hevc else "avc1",
        "-movflags", "+faststart", "-f", "mp4", str(output),
    ]  # fmt: skip
