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

from factory.media.identify import NotMedia, codec_problem, open_media, reader_error
from factory.media.probe import declared_duration

MAX_CONTROL_BYTES = 200 << 20
MAX_CONTROL_SECONDS = 120.0
MAX_CONTROL_PIXELS = 3840 * 2160
MAX_CONTROL_FRAMES = round(MAX_CONTROL_SECONDS * 120)  # 120 s at up to 120 fps
LUMA = np.array([0.299, 0.587, 0.114], np.float32)
STILL_BAND_BYTES = 16 << 20  # of float luma at a time for the median (4x that while made)
LOWPASS_CYCLES = 0.08  # the motion track weighs image detail coarser than this (cycles/px)


@dataclass(frozen=True)
class Template:
    frames: np.ndarray  # [N, H, W, 3] uint8 at the video's fps and frame size
    track: np.ndarray  # [N, 2] float32: where the content has moved by frame i (dx, dy px)


def control_problem(path: Path) -> str | None:
    """Why a template cannot be used (not a video, undecodable, too long, too large), or
    None when it can: identified by its bytes, its length measured by its packets' times
    (what its frames will be shown at, not what its tags say), its first frames decoded."""
    size = path.stat().st_size
    if size > MAX_CONTROL_BYTES:
        return f"is {size >> 20} MiB; at most {MAX_CONTROL_BYTES >> 20} MiB"
    try:
        with open_media(path, "video") as container:
            if not container.streams.video:
                return "holds no video stream"
            stream = container.streams.video[0]
            if problem := codec_problem(stream, "video"):
                return problem
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
        with open_media(path, "video") as container:
            return _timing_problem(container, container.streams.video[0])
    except NotMedia as exc:
        return str(exc)
    except (av.FFmpegError, OSError, ValueError) as exc:
        return f"does not decode as video ({reader_error(exc, path)})"
    return None


def _timing_problem(container: av.container.InputContainer, stream: av.video.stream.VideoStream
                    ) -> str | None:  # fmt: skip
    """Too many frames, or frames shown later than the limit, by the packets themselves."""
    first = last = None
    for count, packet in enumerate(container.demux(stream), start=1):
        if count > MAX_CONTROL_FRAMES:
            return f"has more than {MAX_CONTROL_FRAMES} frames; at most {MAX_CONTROL_FRAMES}"
        if packet.pts is None or packet.time_base is None:
            continue
        at = float(packet.pts * packet.time_base)
        first = at if first is None else min(first, at)
        last = at if last is None else max(last, at)
        if last - first > MAX_CONTROL_SECONDS:
            return _too_long(last - first)
    return None


def _too_long(seconds: float) -> str:
    return f"is {seconds:.0f} s long by its frames' times; at most {MAX_CONTROL_SECONDS:.0f} s"


def load_template(path: Path, width: int, height: int, fps: int, fit: str) -> Template:
    """The template at `fps` and width x height, and its motion track. Output frame i is the
    template's frame shown at i / fps (the last one at or before it, containers round
    times); a frame is sized when it is first picked and nothing else is kept, and the
    template's length is held to the limit by its frames' times as they are decoded."""
    picked: list[np.ndarray] = []
    shown: tuple[float, av.VideoFrame] | None = None  # the frame before, and its time
    sized: np.ndarray | None = None
    start = previous = None
    with open_media(path, "video") as container:
        stream = container.streams.video[0]
        if problem := codec_problem(stream, "video"):
            raise ValueError(problem)
        for count, frame in enumerate(container.decode(stream), start=1):
            at = float(frame.pts * stream.time_base) if frame.pts is not None else count - 1
            start = at if start is None else start
            if at - start > MAX_CONTROL_SECONDS or count > MAX_CONTROL_FRAMES:
                raise ValueError(_too_long(at - start))
            if shown is not None:  # the frame before is shown until this one
                sized = None
                while (len(picked) + 0.5) / fps < at - start:
                    if sized is None:
                        sized = _frame(shown[1], width, height, fit)
                    picked.append(sized)
                previous = shown[0]
            shown = (at - start, frame)
    if shown is None:
        raise ValueError("decodes to no frame")
    end = shown[0] + (shown[0] - previous if previous is not None else 1 / fps)
    last = _frame(shown[1], width, height, fit)
    while len(picked) < max(1, round(end * fps)):
        picked.append(last)
    frames = np.stack(picked)
    return Template(frames, motion_track(frames))


def _frame(frame: av.VideoFrame, width: int, height: int, fit: str) -> np.ndarray:
    return np.asarray(_sized(frame.to_image(), width, height, fit).convert("RGB"), np.uint8)


def motion_track(frames: np.ndarray) -> np.ndarray:
    """Cumulative global translation of the content (dx, dy in pixels) by frame, from the
    phase correlation of each frame's luma with the one before, low-passed, after taking
    away what stands still in every frame (a caption, a logo, a fixed grain would pin the
    correlation at zero). Frame by frame, holding one spectrum and the still image beside
    the frames (a 2-minute move held every frame's float copy and spectrum: gigabytes)."""
    track = np.zeros((len(frames), 2), np.float32)
    height, width = frames.shape[1:3]
    still = _still(frames) if len(frames) >= 3 else None
    window = np.outer(np.hanning(height), np.hanning(width)).astype(np.float32)
    fy, fx = np.fft.fftfreq(height)[:, None], np.fft.rfftfreq(width)[None, :]
    lowpass = np.exp(-(fx**2 + fy**2) / (2 * LOWPASS_CYCLES**2))
    before = None
    for i, frame in enumerate(frames):
        luma = _luma(frame)
        if still is not None:
            luma = luma - still
        spectrum = np.fft.rfft2((luma - luma.mean()) * window)
        if before is not None:
            cross = spectrum * np.conj(before)
            cross = cross / np.maximum(np.abs(cross), 1e-9) * lowpass
            surface = np.fft.irfft2(cross, s=(height, width))
            y, x = np.unravel_index(int(np.argmax(surface)), surface.shape)
            dy = y - surface.shape[0] if y > surface.shape[0] // 2 else y
            dx = x - surface.shape[1] if x > surface.shape[1] // 2 else x
            track[i] = track[i - 1] + (dx, dy)
        before = spectrum
    return track


def _luma(frames: np.ndarray) -> np.ndarray:
    return frames.astype(np.float32) @ LUMA


def _still(frames: np.ndarray) -> np.ndarray:
    """What stands still: each pixel's median luma over the frames, a band of rows at a time
    (the frames' luma together for all rows is 4 bytes a pixel a frame)."""
    rows = max(1, STILL_BAND_BYTES // max(1, 4 * len(frames) * frames.shape[2]))
    still = np.empty(frames.shape[1:3], np.float32)
    for top in range(0, frames.shape[1], rows):
        still[top : top + rows] = np.median(_luma(frames[:, top : top + rows]), axis=0)
    return still


def _sized(picture: Image.Image, width: int, height: int, fit: str) -> Image.Image:
    if fit == "crop":
        return ImageOps.fit(picture, (width, height), Image.Resampling.BILINEAR)
    return ImageOps.pad(picture, (width, height), Image.Resampling.BILINEAR, color=(0, 0, 0))
