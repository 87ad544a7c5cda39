"""The lossless segment intermediate: FFV1 in Matroska, planar RGB (bit-exact to the frames).

One file per segment holds the output frames that segment writes; its tail context (the
generated frames the next segment continues from) is kept beside it as a ``.npy``. Both
are written under a temporary name and renamed, so a crash never leaves a file that looks
done. ``bitexact`` flags keep the files byte-identical for identical frames.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from factory.media.ffmpeg import QUIET, RawVideoWriter, atomic_output, ffmpeg_exe


def ffv1_writer_argv(exe: str, width: int, height: int, fps: int, output: Path) -> list[str]:
    return [
        exe, *QUIET,
        "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{width}x{height}", "-r", str(fps),
        "-i", "-",
        "-c:v", "ffv1", "-level", "3", "-g", "1", "-slices", "4", "-slicecrc", "1",
        "-pix_fmt", "gbrp",
        "-fflags", "+bitexact", "-flags:v", "+bitexact",
        "-f", "matroska", str(output),
    ]  # fmt: skip


def write_segment(path: Path, frames: np.ndarray, fps: int) -> None:
    """Write frames [T, H, W, 3] uint8 to ``path`` atomically."""
    _, height, width, _ = frames.shape
    with (
        atomic_output(path) as tmp,
        RawVideoWriter(ffv1_writer_argv(ffmpeg_exe(), width, height, fps, tmp)) as writer,
    ):
        writer.write(frames)


def decode_argv(exe: str, source: Path) -> list[str]:
    return [exe, *QUIET, "-i", str(source), "-f", "rawvideo", "-pix_fmt", "rgb24", "-"]


def read_frames(path: Path, width: int, height: int) -> np.ndarray:
    """Decode a whole (small) file to [T, H, W, 3] uint8; for tests and QC thumbnails."""
    import subprocess

    from factory.errors import MediaError

    argv = decode_argv(ffmpeg_exe(), path)
    done = subprocess.run(argv, capture_output=True)
    if done.returncode != 0:
        raise MediaError(argv, done.returncode, done.stderr.decode(errors="replace"))
    return np.frombuffer(done.stdout, np.uint8).reshape(-1, height, width, 3)


def write_tail(path: Path, frames: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.part-{os.getpid()}.npy")
    try:
        np.save(tmp, np.ascontiguousarray(frames), allow_pickle=False)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_tail(path: Path) -> np.ndarray:
    return np.load(path, allow_pickle=False)
