"""Replacing a run of whole GOPs inside an encoded chunk, by stream copy.

A redo (factory/plan/redo.py) changes a few seconds of a chunk. Only the closed GOPs that hold
changed frames are encoded again (the *piece*); every other GOP of the chunk is copied
packet for packet from the version before, so its pictures decode bit for bit as before.
The piece starts with an IDR picture at a keyframe of the old chunk and ends where a GOP of
the old chunk starts (or at its end), so the spliced chunk has the old chunk's length and
GOP layout, and the packets after the piece keep their timestamps.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

from factory.errors import MediaError
from factory.media.ffmpeg import atomic_output

if TYPE_CHECKING:
    import av


def keyframe_frames(path: Path, fps: int) -> list[int]:
    """The frame numbers (presentation order, from 0) of a file's keyframes."""
    import av  # (imported where used: planning a redo needs gop_span alone)

    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            return sorted(f for f, p in _packets(stream, container, fps) if p.is_keyframe)
    except (av.error.FFmpegError, OSError) as exc:
        raise MediaError(["pyav.demux", str(path)], 1, str(exc)) from None


def gop_span(keyframes: list[int], frames: int, first: int, end: int) -> tuple[int, int]:
    """The whole GOPs that hold frames [first, end) of a chunk of ``frames`` frames whose GOPs
    start at ``keyframes``: (the keyframe at or before ``first``, the next keyframe at or
    after ``end``, or the chunk's end)."""
    starts = [k for k in keyframes if k <= first]
    ends = [k for k in keyframes if k >= end]
    return (max(starts) if starts else 0), (min(ends) if ends else frames)


def splice(base: Path, piece: Path, start: int, end: int, fps: int, output: Path,
           *, codec_tag: str) -> None:  # fmt: skip
    """``output``: ``base``'s packets for frames before ``start``, then ``piece`` (frames
    [start, end), shifted to start there), then ``base``'s packets from frame ``end`` on.
    ``start`` and ``end`` must be keyframes of ``base`` (or its end); checked, with the
    piece's length."""
    import av

    try:
        with atomic_output(output) as tmp:
            _splice(base, piece, start, end, fps, tmp, codec_tag)
    except (av.error.FFmpegError, OSError) as exc:
        raise MediaError(["pyav.splice", str(base), str(piece)], 1, str(exc)) from None


def _splice(base: Path, piece: Path, start: int, end: int, fps: int, tmp: Path,
            codec_tag: str) -> None:  # fmt: skip
    import av

    with (
        av.open(str(base)) as old,
        av.open(str(piece)) as new,
        av.open(str(tmp), "w", format="mp4", options={"movflags": "+faststart"}) as out,
    ):
        old_stream, new_stream = old.streams.video[0], new.streams.video[0]
        target = out.add_stream_from_template(old_stream)
        target.codec_tag = codec_tag
        old_packets = _packets(old_stream, old, fps)
        new_packets = _packets(new_stream, new, fps)
        if len(new_packets) != end - start:
            message = f"the piece holds {len(new_packets)} frames, not {end - start}"
            raise MediaError(["splice", str(piece)], 1, message)
        keys = {frame for frame, packet in old_packets if packet.is_keyframe}
        total = len(old_packets)
        for frame in (start, end):
            if frame < total and frame not in keys:
                raise MediaError(["splice", str(base)], 1, f"frame {frame} is not a keyframe")
        shift = round(Fraction(start, fps) / new_stream.time_base)
        chosen = [p for f, p in old_packets if f < start]
        last_dts = None
        for packet in chosen:
            last_dts = _mux(out, target, packet, 0, last_dts)
        for _, packet in new_packets:
            last_dts = _mux(out, target, packet, shift, last_dts)
        for packet in (p for f, p in old_packets if f >= end):
            last_dts = _mux(out, target, packet, 0, last_dts)


def _packets(stream: av.video.stream.VideoStream, container: av.container.InputContainer,
             fps: int) -> list[tuple[int, av.Packet]]:  # fmt: skip
    """(frame number, packet) in decode order."""
    base = stream.time_base or Fraction(1, fps)
    start = stream.start_time or 0
    return [
        (round((packet.pts - start) * base * fps), packet)
        for packet in container.demux(stream)
        if packet.size and packet.pts is not None
    ]


def _mux(out: av.container.OutputContainer, target: av.video.stream.VideoStream,
         packet: av.Packet, shift: int, last_dts: Fraction | None) -> Fraction | None:  # fmt: skip
    base = packet.time_base
    packet.pts += shift
    if packet.dts is not None:
        packet.dts += shift
    packet.stream = target
    packet.time_base = base
    dts = None if packet.dts is None else packet.dts * base
    if dts is not None and last_dts is not None and dts <= last_dts:
        raise MediaError(["splice"], 1, "decode timestamps would go backwards at the splice")
    out.mux(packet)
    return dts if dts is not None else last_dts
