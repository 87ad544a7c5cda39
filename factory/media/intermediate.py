"""The lossless segment intermediate: FFV1 in Matroska, RGB (bit-exact to the frames).

One file per segment holds the output frames that segment writes; its tail context (the
generated frames the next segment continues from) is kept beside it as a ``.npy``. Both
are written under a temporary name and renamed, so a crash never leaves a file that looks
done. ``bitexact`` flags keep the files byte-identical for identical frames.
"""

from __future__ import annotations

import os
from pathlib import Path

import av
import numpy as np

from factory.media.ffmpeg import QUIET, atomic_output, ffmpeg_exe


def write_segment(path: Path, frames: np.ndarray, fps: int) -> None:
    """Write frames [T, H, W, 3] uint8 to ``path`` atomically, in-process (PyAV's libavcodec:
    no ffmpeg process to start per segment, which would cost more than the write itself)."""
    _, height, width, _ = frames.shape
    with atomic_output(path) as tmp, av.open(str(tmp), "w", format="matroska",
                 container_options={"fflags": "+bitexact"}) as container:  # fmt: skip
        stream = container.add_stream("ffv1", rate=fps)
        stream.width, stream.height = width, height
        stream.pix_fmt = "bgr0"  # lossless RGB (this libavcodec's FFV1 has no gbrp)
        stream.options = {"level": "3", "g": "1", "slicecrc": "1"}
        stream.codec_context.flags |= av.codec.context.Flags.bitexact
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


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
