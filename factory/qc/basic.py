"""What a job's rendition must be, from probing alone: the preset's codec, size and pixel
format, every planned frame at the planned duration, and the stream checks every
deliverable needs (GOP at most 2 s and closed, `hvc1`, A/V offsets at most 42 ms)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from factory.media.presets import PRESETS
from factory.media.probe import Probe
from factory.qc.gate import Check, stream_checks
from factory.spec import VideoSpec

CODECS = {"libx265": "hevc", "libx264": "h264"}


def expected_checks(video: VideoSpec, rendition: str, facts: Probe) -> list[Check]:
    preset = PRESETS[rendition]
    checks = stream_checks(facts)
    v = facts.video
    checks.append(
        Check(
            "audio_stream",
            facts.audio is not None,
            facts.audio is not None,
            True,
            "no audio stream",
        )
    )
    if v is None:
        return checks
    codec = CODECS[preset.codec]
    size = "{}x{}".format(*preset.output_size(video.width, video.height))
    expected_duration = round(video.frames_total / video.fps, 4)
    checks += [
        Check("codec", v.codec == codec, v.codec, codec),
        Check("size", f"{v.width}x{v.height}" == size, f"{v.width}x{v.height}", size),
        Check("pix_fmt", v.pix_fmt == preset.pix_fmt, v.pix_fmt, preset.pix_fmt),
        Check(
            "frames",
            v.frames == video.frames_total,
            v.frames,
            video.frames_total,
            f"{v.frames} frames in the file; {video.frames_total} were made",
        ),
        Check(
            "duration",
            abs(v.duration - expected_duration) <= 0.5 / video.fps,
            round(v.duration, 4),
            expected_duration,
        ),
    ]
    return checks


def check_rendition(video: VideoSpec, rendition: str, facts: Probe) -> dict[str, Any]:
    checks = expected_checks(video, rendition, facts)
    return {
        "passed": all(c.passed for c in checks),
        "checks": [c.to_dict() for c in checks],
        "probe": probe_summary(facts),
    }


def probe_summary(facts: Probe) -> dict[str, Any]:
    probe = asdict(facts)
    if probe.get("video") and facts.video is not None:
        probe["video"].pop("keyframe_times", None)
        probe["video"]["max_gop_seconds"] = facts.video.max_gop_seconds
    return probe
