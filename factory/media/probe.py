"""Probing outputs with PyAV (the imageio-ffmpeg build ships no ffprobe): stream facts,
frame count and keyframes from demuxing alone (no decoding), and whether every keyframe
is an IDR picture, i.e. the GOPs are closed.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import av

from factory.errors import MediaError

# NAL unit types of pictures that start a closed GOP.
_HEVC_IDR = {19, 20}  # IDR_W_RADL, IDR_N_LP (21, CRA, starts an open GOP)
_H264_IDR = {5}


@dataclass(frozen=True)
class VideoFacts:
    codec: str
    codec_tag: str
    profile: str | None
    pix_fmt: str | None
    width: int
    height: int
    fps: float
    start: float
    duration: float
    frames: int
    keyframe_times: list[float] = field(default_factory=list)
    open_keyframes: int = 0  # keyframes that are not IDR pictures
    # What the container's header/index says, whether or not the data is there (a faststart
    # MP4 cut short keeps its index): None where it declares nothing (a raw stream).
    declared_frames: int | None = None
    declared_duration: float | None = None

    @property
    def max_gop_seconds(self) -> float:
        marks = [*self.keyframe_times, self.start + self.duration]
        return max((b - a for a, b in itertools.pairwise(marks)), default=0.0)


@dataclass(frozen=True)
class AudioFacts:
    codec: str
    sample_rate: int
    channels: int
    start: float
    duration: float


@dataclass(frozen=True)
class Probe:
    path: str
    format: str
    size: int
    video: VideoFacts | None
    audio: AudioFacts | None


def probe(path: Path) -> Probe:
    try:
        with av.open(str(path)) as container:
            video = _video(container) if container.streams.video else None
            audio = _audio(container.streams.audio[0]) if container.streams.audio else None
            fmt = container.format.name
    except (av.error.FFmpegError, OSError) as exc:
        raise MediaError(["pyav.open", str(path)], 1, str(exc)) from None
    return Probe(str(path), fmt, path.stat().st_size, video, audio)


def video_packet_digests(path: Path, counts: Sequence[int]) -> list[tuple[int, str]]:
    """(packets, sha256 of their payloads) for consecutive runs of the video's packets, in
    decode order: the first ``counts[0]`` packets, the next ``counts[1]``, ..., and one more
    run with whatever follows. Demuxing only. A file joined from chunks by stream copy has,
    run by run, exactly the packets of its chunks: equal digests mean the pictures that were
    decoded and measured in the chunks are the ones in the file."""
    runs: list[tuple[int, str]] = []
    bounds = list(counts)
    digest, taken = hashlib.sha256(), 0
    try:
        with av.open(str(path)) as container:
            for packet in container.demux(container.streams.video[0]):
                if packet.size == 0:
                    continue
                while bounds and taken == bounds[0]:
                    runs.append((taken, digest.hexdigest()))
                    bounds.pop(0)
                    digest, taken = hashlib.sha256(), 0
                digest.update(bytes(packet))
                taken += 1
    except (av.error.FFmpegError, OSError) as exc:
        raise MediaError(["pyav.demux", str(path)], 1, str(exc)) from None
    runs.append((taken, digest.hexdigest()))
    while bounds:  # the file ended before these runs: empty ones
        bounds.pop(0)
        runs.append((0, hashlib.sha256().hexdigest()))
    return runs


def _video(container: av.container.InputContainer) -> VideoFacts:
    stream = container.streams.video[0]
    ctx = stream.codec_context
    base = stream.time_base or Fraction(1, 1)
    hevc = ctx.name == "hevc"
    frames, keyframes, open_keys, last_end = 0, [], 0, 0.0
    first_pts: float | None = None
    for packet in container.demux(stream):
        if packet.size == 0 or packet.pts is None:
            continue
        frames += 1
        pts = float(packet.pts * base)
        first_pts = pts if first_pts is None else min(first_pts, pts)
        last_end = max(last_end, pts + float((packet.duration or 0) * base))
        if packet.is_keyframe:
            keyframes.append(pts)
            if not _starts_closed_gop(bytes(packet), hevc):
                open_keys += 1
    start = float(stream.start_time * base) if stream.start_time is not None else (first_pts or 0)
    duration = float(stream.duration * base) if stream.duration else last_end - start
    rate = stream.average_rate or stream.guessed_rate or 0
    stated = declared_duration(container, stream)
    return VideoFacts(
        codec=ctx.name,
        codec_tag=stream.codec_tag,
        profile=ctx.profile,
        pix_fmt=ctx.pix_fmt,
        width=ctx.width,
        height=ctx.height,
        fps=float(rate),
        start=start,
        duration=duration,
        frames=frames,
        keyframe_times=sorted(keyframes),
        open_keyframes=open_keys,
        declared_frames=_declared_frames(stream, stated, float(rate)),
        declared_duration=stated,
    )


def declared_duration(container: av.container.InputContainer, stream: av.stream.Stream
                      ) -> float | None:  # fmt: skip
    """A stream's duration as the container states it, nothing decoded: the stream's (MP4
    index), else its Matroska DURATION tag, else the format's."""
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    tag = _clock_seconds(stream.metadata.get("DURATION") or stream.metadata.get("duration"))
    if tag is not None:
        return tag
    return container.duration / av.time_base if container.duration else None


def _declared_frames(
    stream: av.video.stream.VideoStream, duration: float | None, fps: float
) -> int | None:
    """The stream's frame count (MP4 index), else its declared duration x fps (Matroska)."""
    if stream.frames:
        return int(stream.frames)
    return round(duration * fps) if duration and fps > 0 else None


def _clock_seconds(value: str | None) -> float | None:
    """`00:00:06.000000000` (Matroska's DURATION tag) in seconds."""
    try:
        hours, minutes, seconds = (value or "").split(":")
        return int(hours) * 3600 + int(minutes) * 60 + float(seconds)
    except ValueError:
        return None


def _audio(stream: av.audio.stream.AudioStream) -> AudioFacts:
    base = stream.time_base or Fraction(1, 1)
    return AudioFacts(
        codec=stream.codec_context.name,
        sample_rate=stream.codec_context.sample_rate,
        channels=stream.codec_context.channels,
        start=float(stream.start_time * base) if stream.start_time is not None else 0.0,
        duration=float(stream.duration * base) if stream.duration else 0.0,
    )


def _starts_closed_gop(data: bytes, hevc: bool) -> bool:
    """Whether a keyframe packet (MP4: 4-byte length-prefixed NAL units) holds an IDR picture."""
    wanted = _HEVC_IDR if hevc else _H264_IDR
    offset = 0
    while offset + 5 <= len(data):
        size = int.from_bytes(data[offset : offset + 4], "big")
        header = data[offset + 4]
        nal_type = (header >> 1) & 0x3F if hevc else header & 0x1F
        if nal_type in wanted:
            return True
        offset += 4 + size
    return False
