"""Camera-move templates: a short video of the move (or of its depth or flow rendering) that a
scene follows. Checked before a batch is accepted; decoded once per worker, resampled to the
video's frame rate (for output time t, the template's frame nearest t) and brought to its
frame size by the video's `image_fit` rule; its global motion measured frame to frame by
phase correlation (what the procedural generator follows; models read the frames).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np
from PIL import Image, ImageOps

from factory.media.probe import declared_duration

MAX_CONTROL_BYTES = 200 << 20
MAX_CONTROL_SECONDS = 120.0
MAX_CONTROL_PIXELS = 3840 * 2160
LOWPASS_CYCLES = 0.08  # the motion track weighs image detail coarser than this (cycles/px)


@dataclass(frozen=True)
class Template:
    frames: np.ndarray  # [N, H, W, 3] uint8 at the video's fps and frame size
    track: np.ndarray  # [N, 2] float32: where the content has moved by frame i (dx, dy px)


def control_problem(path: Path) -> str | None:
    """Why a template cannot be used (not a video, undecodable, too long, too large), or
    None when it can: its header read and its first frame decoded."""
    size = path.stat().st_size
    if size > MAX_CONTROL_BYTES:
        return f"is {size >> 20} MiB; at most {MAX_CONTROL_BYTES >> 20} MiB"
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                return "holds no video stream"
            stream = container.streams.video[0]
            pixels = (stream.codec_context.width or 0) * (stream.codec_context.height or 0)
            if pixels > MAX_CONTROL_PIXELS:
                return f"is {stream.codec_context.width}x{stream.codec_context.height}; at most 4K"
            seconds = declared_duration(container, stream)
            if seconds is not None and seconds > MAX_CONTROL_SECONDS:
                return f"is {seconds:.0f} s long; at most {MAX_CONTROL_SECONDS:.0f} s"
            decoded = sum(1 for _ in itertools.islice(container.decode(stream), 2))
            if decoded == 0:
                return "decodes to no frame"
            if decoded == 1:
                return "is a still (one frame): a camera move is a video of the move"
    except (av.FFmpegError, OSError, ValueError) as exc:
        return f"does not decode as video ({str(exc)[:200]})"
    return None


def load_template(path: Path, width: int, height: int, fps: int, fit: str) -> Template:
    """The template at `fps` and width x height, and its motion track."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stamped = []
        for frame in container.decode(stream):
            at = float(frame.pts * stream.time_base) if frame.pts is not None else len(stamped)
            stamped.append((at, frame.to_image()))
    if not stamped:
        raise ValueError("decodes to no frame")
    start = stamped[0][0]
    end = stamped[-1][0] + (stamped[-1][0] - stamped[-2][0] if len(stamped) > 1 else 1 / fps)
    count = max(1, round((end - start) * fps))
    times = [t - start for t, _ in stamped]
    picked, k = [], 0
    for i in range(count):  # the frame nearest output time i / fps (containers round times)
        while k + 1 < len(times) and times[k + 1] <= (i + 0.5) / fps:
            k += 1
        picked.append(stamped[k][1])
    sized = [_sized(picture, width, height, fit) for picture in picked]
    frames = np.stack([np.asarray(p.convert("RGB"), np.uint8) for p in sized])
    return Template(frames, motion_track(frames))


def motion_track(frames: np.ndarray) -> np.ndarray:
    """Cumulative global translation of the content (dx, dy in pixels) by frame, from the
    phase correlation of each frame's luma with the one before, low-passed, after taking
    away what stands still in every frame (a caption, a logo, a fixed grain would pin the
    correlation at zero)."""
    track = np.zeros((len(frames), 2), np.float32)
    luma = frames.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
    if len(luma) >= 3:  # what stands still (a caption, a logo, a fixed grain) says nothing
        luma = luma - np.median(luma, axis=0)
    height, width = luma.shape[1:]
    window = np.outer(np.hanning(height), np.hanning(width)).astype(np.float32)
    fy, fx = np.fft.fftfreq(height)[:, None], np.fft.rfftfreq(width)[None, :]
    lowpass = np.exp(-(fx**2 + fy**2) / (2 * LOWPASS_CYCLES**2))
    spectra = [np.fft.rfft2((f - f.mean()) * window) for f in luma]
    for i in range(1, len(frames)):
        cross = spectra[i] * np.conj(spectra[i - 1])
        cross = cross / np.maximum(np.abs(cross), 1e-9) * lowpass
        surface = np.fft.irfft2(cross, s=luma.shape[1:])
        y, x = np.unravel_index(int(np.argmax(surface)), surface.shape)
        dy = y - surface.shape[0] if y > surface.shape[0] // 2 else y
        dx = x - surface.shape[1] if x > surface.shape[1] // 2 else x
        track[i] = track[i - 1] + (dx, dy)
    return track


def _sized(picture: Image.Image, width: int, height: int, fit: str) -> Image.Image:
    if fit == "crop":
        return ImageOps.fit(picture, (width, height), Image.Resampling.BILINEAR)
    return ImageOps.pad(picture, (width, height), Image.Resampling.BILINEAR, color=(0, 0, 0))
