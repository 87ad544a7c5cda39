"""Transitions between shots, made losslessly before a chunk is encoded: the outgoing shot's
run-on blended into the incoming shot's first frames by ffmpeg's `xfade` filter, and a
segment file cut to the frames its shot owns (its run-on left out). Both write lossless
intermediates (FFV1, RGB) that the encoder and the quality gate read like segment files.

`xfade` with offset 0 over T frames: output frame i < T is the transition at progress
1 - i / T (for `fade`: outgoing * (1 - i / T) + incoming * i / T), then the incoming frames
as they are. Both inputs are retimed to 1/fps first, so the progress is exact per frame.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from factory.media.concat import ffconcat
from factory.media.ffmpeg import QUIET, ffmpeg_exe, run

# As factory/media/intermediate.py writes segments: every frame a keyframe (FFV1 carries its
# context state from frame to frame otherwise, and the gate decodes only every Nth frame).
_LOSSLESS = ("-c:v", "ffv1", "-level", "3", "-g", "1", "-slicecrc", "1", "-pix_fmt", "bgr0",
             "-fflags", "+bitexact", "-flags", "+bitexact", "-f", "matroska")  # fmt: skip


def blend_transition(
    outgoing: Sequence[tuple[Path, int]],
    skip: int,
    incoming: Sequence[tuple[Path, int]],
    keep: int,
    xfade: str,
    frames: int,
    fps: int,
    target: Path,
) -> None:
    """Write to `target` the first `keep` frames of `incoming` (segment files with their
    frame counts), of which the first `frames` are blended by the `xfade` transition with
    the `outgoing` files' frames from frame `skip` on."""
    first, second = target.with_suffix(".out.ffconcat"), target.with_suffix(".in.ffconcat")
    first.write_text(ffconcat(outgoing, fps))
    second.write_text(ffconcat(incoming, fps))
    retime = f"settb=1/{fps},setpts=N"
    graph = (
        f"[0:v]trim=start_frame={skip}:end_frame={skip + frames},{retime}[a];"
        f"[1:v]trim=end_frame={keep},{retime}[b];"
        f"[a][b]xfade=transition={xfade}:duration={frames / fps:.9f}:offset=0,format=bgr0"
    )
    run([
        ffmpeg_exe(), *QUIET,
        "-f", "concat", "-safe", "0", "-i", str(first),
        "-f", "concat", "-safe", "0", "-i", str(second),
        "-filter_complex", graph, "-frames:v", str(keep), *_LOSSLESS, str(target),
    ])  # fmt: skip


def first_frames(source: Path, count: int, target: Path) -> None:
    """The first `count` frames of a lossless segment file, copied (FFV1 is intra-only, so
    the cut is exact and nothing is decoded)."""
    run([ffmpeg_exe(), *QUIET, "-i", str(source), "-map", "0:v:0", "-c", "copy",
         "-frames:v", str(count), "-f", "matroska", str(target)])  # fmt: skip
