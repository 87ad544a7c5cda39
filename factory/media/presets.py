"""Encoding presets per target device, and the encoder argv they produce.

Every preset fixes codec, bounding size, CRF, profile, pixel format, level, a closed GOP of
at most 2 s (keyframes exactly every 2 s: ``keyint = min-keyint = 2 * fps``, no scene-cut
keyframes), the ``hvc1`` tag for HEVC (Apple players need it) and ``+faststart``.

Renditions never upscale: a preset larger than the source is capped to the source size.
The output keeps the source's aspect ratio inside the preset's box, rounded down to even
sides (4:2:0 needs them).

ffmpeg ignores unknown ``-x265-params`` keys and exits 0 (x265 only logs "Unknown
option"), so every x265 key is checked here against the options x265 4.x knows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from factory.media.ffmpeg import QUIET

GOP_SECONDS = 2

# x265 4.x options this factory may set (a subset of `x265 --fullhelp`); anything else is refused.
X265_KNOWN_KEYS = frozenset({
    "keyint", "min-keyint", "open-gop", "scenecut", "repeat-headers", "level-idc", "high-tier",
    "log-level", "bframes", "ref", "rc-lookahead", "aq-mode", "aq-strength", "psy-rd",
    "psy-rdoq", "no-sao", "sao", "deblock", "wpp", "pools", "frame-threads", "vbv-maxrate",
    "vbv-bufsize", "hdr10", "colorprim", "transfer", "colormatrix", "range", "info", "hrd",
    "aud", "strong-intra-smoothing", "b-intra", "weightb", "tu-intra-depth", "tu-inter-depth",
})  # fmt: skip


class PresetError(ValueError):
    pass


@dataclass(frozen=True)
class Preset:
    name: str
    codec: str  # libx265 | libx264
    width: int  # bounding box
    height: int
    crf: int
    profile: str
    pix_fmt: str
    level: str
    speed: str = "medium"
    extra_x265: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_hevc(self) -> bool:
        return self.codec == "libx265"

    def output_size(self, source_width: int, source_height: int) -> tuple[int, int]:
        """The preset's box fitted to the source's aspect ratio, never larger than the source."""
        scale = min(1.0, self.width / source_width, self.height / source_height)
        return _even(source_width * scale), _even(source_height * scale)


PRESETS: dict[str, Preset] = {
    "master": Preset("master", "libx265", 1920, 1080, crf=20, profile="main10",
                     pix_fmt="yuv420p10le", level="4.1"),
    "mobile": Preset("mobile", "libx265", 1280, 720, crf=24, profile="main",
                     pix_fmt="yuv420p", level="4"),
    "compat": Preset("compat", "libx264", 1280, 720, crf=23, profile="high",
                     pix_fmt="yuv420p", level="4.0"),
}  # fmt: skip


def x265_params(preset: Preset, fps: int) -> str:
    keyint = GOP_SECONDS * fps
    params = {
        "keyint": str(keyint),
        "min-keyint": str(keyint),
        "open-gop": "0",
        "scenecut": "0",
        "repeat-headers": "1",  # the concat demuxer keeps only the first chunk's extradata
        "level-idc": preset.level,  # `-level` is ignored by libx265
        "log-level": "error",
        **preset.extra_x265,
    }
    unknown = sorted(set(params) - X265_KNOWN_KEYS)
    if unknown:
        raise PresetError(
            f"preset {preset.name}: unknown x265 option(s) {', '.join(unknown)}; x265 would "
            "ignore them silently (for tiles use kvazaar; x265 uses WPP)"
        )
    return ":".join(f"{k}={v}" for k, v in params.items())


def encoder_args(preset: Preset, fps: int) -> list[str]:
    keyint = str(GOP_SECONDS * fps)
    common = ["-crf", str(preset.crf), "-preset", preset.speed, "-pix_fmt", preset.pix_fmt]
    if preset.is_hevc:
        return ["-c:v", "libx265", *common, "-profile:v", preset.profile,
                "-x265-params", x265_params(preset, fps), "-tag:v", "hvc1"]  # fmt: skip
    return ["-c:v", "libx264", *common, "-profile:v", preset.profile, "-level:v", preset.level,
            "-g", keyint, "-keyint_min", keyint, "-sc_threshold", "0", "-flags", "+cgop",
            "-x264-params", "repeat-headers=1", "-tag:v", "avc1"]  # fmt: skip


def video_filter(
    preset: Preset, fps: int, source: tuple[int, int], trim: tuple[int, int] | None = None
) -> str:
    """Frame timestamps renumbered from the frame index (exact durations), then scaled;
    ``trim``: only the input's frames [first, end)."""
    width, height = preset.output_size(*source)
    steps = [f"trim=start_frame={trim[0]}:end_frame={trim[1]}"] if trim else []
    steps += [f"settb=1/{fps}", "setpts=N"]
    if (width, height) != source:
        steps.append(f"scale={width}:{height}:flags=lanczos")
    steps.append(f"scale=out_color_matrix=bt709:out_range=tv,format={preset.pix_fmt}")
    return ",".join(steps)


def encode_argv(
    exe: str,
    preset: Preset,
    fps: int,
    source: tuple[int, int],
    concat_list: Path,
    output: Path,
    *,
    trim: tuple[int, int] | None = None,
    keyframes: Sequence[int] | None = None,
) -> list[str]:
    """Encode the frames listed in an ffconcat file (segment intermediates) to one MP4:
    all of them, or the frames [first, end) of ``trim``. ``keyframes``: frames (of the
    output) that must start a closed GOP, besides the encoder's own every GOP_SECONDS."""
    forced: list[str] = []
    if keyframes:
        # ffmpeg forces the first frame at or after each time: rounding up would miss it.
        times = ",".join(f"{math.floor(frame / fps * 1e6) / 1e6:.6f}" for frame in keyframes)
        forced = ["-force_key_frames", times, "-forced-idr", "1"]
    return [
        exe, *QUIET,
        "-f", "concat", "-safe", "0", "-i", str(concat_list),
        "-map", "0:v:0", "-an",
        "-vf", video_filter(preset, fps, source, trim), "-r", str(fps),
        *encoder_args(preset, fps), *forced,
        "-colorspace", "bt709", "-color_primaries", "bt709", "-color_trc", "bt709",
        "-movflags", "+faststart", "-f", "mp4", str(output),
    ]  # fmt: skip


def _even(value: float) -> int:
    return max(2, int(value) // 2 * 2)
