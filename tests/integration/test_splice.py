"""Splicing GOPs into an encoded chunk (factory/media/splice.py), with real ffmpeg encodes:
the GOPs around the piece are copied packet for packet and decode bit for bit as before, the
piece must start and end at the old chunk's keyframes and hold exactly the frames it replaces,
and `keyframes: segments` forces GOP starts where a chunk's segments start."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest

from factory.errors import MediaError
from factory.media.concat import ffconcat
from factory.media.ffmpeg import ffmpeg_exe, run
from factory.media.intermediate import write_segment
from factory.media.presets import PRESETS, encode_argv
from factory.media.probe import probe
from factory.media.splice import gop_span, keyframe_frames, splice

FPS = 16
SIZE = (160, 96)


def frames(count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 255, (1, SIZE[1] // 8, SIZE[0] // 8, 3)).astype(np.float32)
    drift = np.arange(count, dtype=np.float32)[:, None, None, None]
    small = np.clip(base + 2.0 * drift, 0, 255).astype(np.uint8)
    return small.repeat(8, axis=1).repeat(8, axis=2)


def encode(
    tmp: Path, pictures: np.ndarray, rendition: str, name: str, fps: int = FPS, **kwargs
) -> Path:
    source = tmp / f"{name}.mkv"
    write_segment(source, pictures, fps)
    listing = tmp / f"{name}.ffconcat"
    listing.write_text(ffconcat([(source, len(pictures))], fps))
    target = tmp / f"{name}.mp4"
    run(encode_argv(ffmpeg_exe(), PRESETS[rendition], fps, SIZE, listing, target, **kwargs))
    return target


def decode(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


@pytest.mark.parametrize("rendition", ["master", "mobile", "compat"])
def test_a_spliced_chunk_keeps_every_other_gop_bit_for_bit(tmp_path: Path, rendition: str):
    old_frames = frames(128, seed=1)
    new_frames = old_frames.copy()
    new_frames[40:56] = frames(16, seed=2)  # the change: inside the GOP [32, 64)
    old = encode(tmp_path, old_frames, rendition, "old")
    assert keyframe_frames(old, FPS) == [0, 32, 64, 96]
    start, end = gop_span(keyframe_frames(old, FPS), 128, 40, 56)
    assert (start, end) == (32, 64)
    piece = encode(tmp_path, new_frames, rendition, "piece", trim=(start, end))
    out = tmp_path / "spliced.mp4"
    tag = "hvc1" if PRESETS[rendition].is_hevc else "avc1"
    splice(old, piece, start, end, FPS, out, codec_tag=tag)

    facts = probe(out).video
    assert facts.frames == 128 and facts.codec_tag == tag and facts.open_keyframes == 0
    assert abs(facts.duration - 8.0) < 1e-3
    assert keyframe_frames(out, FPS) == [0, 32, 64, 96]
    before, after = decode(old), decode(out)
    assert all(np.array_equal(before[i], after[i]) for i in [*range(32), *range(64, 128)])
    assert not np.array_equal(before[45], after[45])
    changed = np.abs(after[45].astype(int) - decode(piece)[13].astype(int)).max()
    assert changed == 0  # the piece's pictures, at their place


def test_a_splice_must_replace_whole_gops_with_as_many_frames(tmp_path: Path) -> None:
    pictures = frames(96, seed=3)
    old = encode(tmp_path, pictures, "mobile", "old")
    piece = encode(tmp_path, pictures, "mobile", "piece", trim=(32, 64))
    with pytest.raises(MediaError, match="frame 40 is not a keyframe"):
        splice(old, piece, 40, 72, FPS, tmp_path / "a.mp4", codec_tag="hvc1")
    with pytest.raises(MediaError, match="holds 32 frames, not 64"):
        splice(old, piece, 32, 96, FPS, tmp_path / "b.mp4", codec_tag="hvc1")
    assert not list(tmp_path.glob("a*.mp4")) and not list(tmp_path.glob("b*.mp4"))


@pytest.mark.parametrize("rendition", ["master", "compat"])
def test_forced_keyframes_start_closed_gops_where_asked(tmp_path: Path, rendition: str):
    """Frame 20 at 12 fps is 1.666... s: written in microseconds it must round down, or
    ffmpeg puts the keyframe on the next frame."""
    pictures = frames(80, seed=4)
    out = encode(tmp_path, pictures, rendition, "forced", fps=12, keyframes=[0, 20, 40, 60])
    assert keyframe_frames(out, 12) == [0, 20, 40, 60]
    assert probe(out).video.open_keyframes == 0
    thirds = encode(tmp_path, frames(72, seed=5), rendition, "thirds", keyframes=[0, 24, 48])
    assert keyframe_frames(thirds, FPS) == [0, 24, 48]
