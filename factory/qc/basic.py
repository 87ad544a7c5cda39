"""Basic checks on every rendition, from probing alone: codec, tag, size, pixel format, frame
count and duration against the plan, GOP (at most 2 s, every keyframe an IDR picture), and
audio/video start and duration offsets (at most 42 ms).

Report schema ``factory.qc/1`` (docs/qc.md): ``{"schema", "job_id", "passed",
"failures": [text], "renditions": {name: {"passed", "checks": [{"name", "passed",
"value", "limit"}], "probe": {...}}}}``.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from factory.media.presets import GOP_SECONDS, PRESETS
from factory.media.probe import Probe
from factory.spec import VideoSpec

SCHEMA = "factory.qc/1"
AV_TOLERANCE_S = 0.042
CODECS = {"libx265": ("hevc", "hvc1"), "libx264": ("h264", "avc1")}


def check_rendition(video: VideoSpec, rendition: str, facts: Probe) -> dict[str, Any]:
    preset = PRESETS[rendition]
    checks: list[dict[str, Any]] = []

    def check(name: str, passed: bool, value: Any, limit: Any) -> None:
        checks.append({"name": name, "passed": bool(passed), "value": value, "limit": limit})

    v, a = facts.video, facts.audio
    check("video_stream", v is not None, v is not None, True)
    check("audio_stream", a is not None, a is not None, True)
    if v is not None:
        codec, tag = CODECS[preset.codec]
        expected_duration = video.frames_total / video.fps
        check("codec", v.codec == codec, v.codec, codec)
        check("codec_tag", v.codec_tag == tag, v.codec_tag, tag)
        check(
            "size",
            (v.width, v.height) == preset.output_size(video.width, video.height),
            f"{v.width}x{v.height}",
            "{}x{}".format(*preset.output_size(video.width, video.height)),
        )
        check("pix_fmt", v.pix_fmt == preset.pix_fmt, v.pix_fmt, preset.pix_fmt)
        check("frames", v.frames == video.frames_total, v.frames, video.frames_total)
        check(
            "duration",
            abs(v.duration - expected_duration) <= 0.5 / video.fps,
            round(v.duration, 4),
            round(expected_duration, 4),
        )
        check(
            "gop_seconds",
            v.max_gop_seconds <= GOP_SECONDS + 1e-6,
            round(v.max_gop_seconds, 3),
            GOP_SECONDS,
        )
        check("closed_gop", v.open_keyframes == 0, v.open_keyframes, 0)
        if a is not None:
            check(
                "av_start_offset",
                abs(v.start - a.start) <= AV_TOLERANCE_S,
                round(v.start - a.start, 4),
                AV_TOLERANCE_S,
            )
            check(
                "av_duration_offset",
                abs(v.duration - a.duration) <= AV_TOLERANCE_S,
                round(v.duration - a.duration, 4),
                AV_TOLERANCE_S,
            )
    probe = asdict(facts)
    if probe.get("video"):
        probe["video"].pop("keyframe_times", None)
        probe["video"]["max_gop_seconds"] = v.max_gop_seconds if v else None
    return {"passed": all(c["passed"] for c in checks), "checks": checks, "probe": probe}


def report(job_id: str, renditions: dict[str, dict[str, Any]]) -> dict[str, Any]:
    failures = [
        f"{name}: {c['name']} is {c['value']}, expected {c['limit']}"
        for name, result in renditions.items()
        for c in result["checks"]
        if not c["passed"]
    ]
    return {
        "schema": SCHEMA,
        "job_id": job_id,
        "passed": not failures,
        "failures": failures,
        "renditions": renditions,
    }
