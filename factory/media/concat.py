"""Joining without re-encoding: the ffconcat list and the stream-copy command.

The concat demuxer rounds each file's duration up to the millisecond (about 0.67 ms per
joint at 24 fps, 80 ms over 120 joints, past the 42 ms A/V budget), so every entry carries
its exact duration in frames / fps.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from factory.media.ffmpeg import QUIET


def ffconcat(entries: Sequence[tuple[Path, int]], fps: int) -> str:
    """``entries``: (file, frame count) in order."""
    lines = ["ffconcat version 1.0"]
    for path, frames in entries:
        lines.append(f"file '{_quote(path)}'")
        lines.append(f"duration {frames / fps:.9f}")
    return "\n".join(lines) + "\n"


def concat_copy_argv(exe: str, concat_list: Path, output: Path, *, hevc: bool) -> list[str]:
    return [
        exe, *QUIET,
        "-f", "concat", "-safe", "0", "-i", str(concat_list),
        "-map", "0:v:0", "-c", "copy", "-tag:v", "hvc1" if hevc else "avc1",
        "-movflags", "+faststart", "-f", "mp4", str(output),
    ]  # fmt: skip


def _quote(path: Path) -> str:
    return str(path.resolve()).replace("'", "'\\''")
