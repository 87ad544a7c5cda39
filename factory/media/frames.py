"""Picking frames out of a video by index, streaming (PyAV): only the frames asked for are
kept, so windows around seams of a two-minute video never hold the whole video. In an
intra-only file (the FFV1 segment intermediates) only the frames asked for are decoded at
all: every packet is a picture of its own."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import av
import numpy as np

INTRA_ONLY = {"ffv1", "rawvideo", "utvideo", "huffyuv", "ffvhuff", "prores", "mjpeg", "png"}


def frames_at(path: Path, wanted: Iterable[int]) -> dict[int, np.ndarray]:
    """{index: [H, W, 3] uint8 RGB} for each wanted frame index that exists."""
    want = set(wanted)
    found: dict[int, np.ndarray] = {}
    if not want:
        return found
    last = max(want)
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        if stream.codec_context.name in INTRA_ONLY:
            index = 0
            for packet in container.demux(stream):
                if packet.size == 0:
                    continue
                if index in want:
                    if not packet.is_keyframe:  # FFV1 with g > 1 carries state between frames
                        break
                    for frame in packet.decode():
                        found[index] = frame.to_ndarray(format="rgb24")
                if index >= last:
                    return found
                index += 1
            else:
                return found
            found.clear()
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        for index, frame in enumerate(container.decode(stream)):
            if index in want:
                found[index] = frame.to_ndarray(format="rgb24")
            if index >= last:
                break
    return found


def window(found: dict[int, np.ndarray], start: int, stop: int) -> np.ndarray:
    """Frames start..stop-1 that were found, stacked (missing ones skipped)."""
    picked = [found[i] for i in range(start, stop) if i in found]
    return np.stack(picked) if picked else np.empty((0, 0, 0, 3), np.uint8)
