"""The quality gate: turning measurements (a probe, one ffmpeg analysis pass, seam scores) into
named checks, each with its value, its limit and, when it fails, why.

Used by the pipeline's qc stage (every rendition of a job, against its lossless segment
intermediates) and by `factory qc VIDEO [--reference REF]` on any file.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from factory.media.analyze import PassResult
from factory.media.presets import GOP_SECONDS
from factory.media.probe import Probe
from factory.media.sound import LoudnessMeasure
from factory.qc.seams import SeamScore
from factory.qc.thresholds import QcThresholds
from factory.spec import Loudness

SCHEMA = "factory.qc/2"
AV_TOLERANCE_S = 0.042
PSNR_KIND = "PSNR-Y (luma), per frame, arithmetic mean over frames"
TAGS = {"hevc": "hvc1", "h264": "avc1"}
TRUNCATION_FRAMES = 1  # decoded may fall this many frames short of the declared count


@dataclass
class Check:
    name: str
    passed: bool
    value: Any
    limit: Any
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = {"name": self.name, "passed": self.passed, "value": self.value, "limit": self.limit}
        if not self.passed:
            out["why"] = self.why or f"{self.name} is {self.value}, expected {self.limit}"
        return out


def decode_checks(result: PassResult, expected_frames: int | None) -> list[Check]:
    checks = [
        Check(
            "decodes",
            result.decoded_ok,
            result.decoded_ok,
            True,
            f"decoding failed: {result.decode_error[:300]}",
        ),
    ]
    if expected_frames is not None:
        checks.append(
            Check(
                "frames_decoded",
                result.frames == expected_frames,
                result.frames,
                expected_frames,
                f"{result.frames} frames decode, the source has {expected_frames}",
            )
        )
    return checks


def truncation_checks(facts: Probe, result: PassResult) -> list[Check]:
    """The frames and seconds that decode against what the container declares (its index
    survives a copy cut short, its frames do not); one frame short is tolerated."""
    v = facts.video
    if v is None or result.frames is None or v.declared_frames is None:
        return []
    decoded = result.frames
    seconds = decoded / v.fps if v.fps > 0 else None
    declared_s = v.declared_duration
    short_frames = v.declared_frames - decoded > TRUNCATION_FRAMES
    short_seconds = (
        seconds is not None
        and declared_s is not None
        and declared_s - seconds > TRUNCATION_FRAMES / v.fps + 1e-3
    )
    return [
        Check(
            "truncated",
            not (short_frames or short_seconds),
            {"frames": decoded, "seconds": _seconds(seconds)},
            {"frames": v.declared_frames, "seconds": _seconds(declared_s)},
            f"declared {v.declared_frames} frames / {_tenths(declared_s)} s, "
            f"decoded {decoded} / {_tenths(seconds)} s",
        )
    ]


def stream_checks(facts: Probe) -> list[Check]:
    """What any deliverable must satisfy: GOP at most 2 s and closed, the Apple tag on HEVC,
    audio and video starting and ending together (when there is audio)."""
    checks = []
    v, a = facts.video, facts.audio
    checks.append(Check("video_stream", v is not None, v is not None, True, "no video stream"))
    if v is None:
        return checks
    gop = round(v.max_gop_seconds, 3)
    checks.append(
        Check(
            "gop_seconds",
            gop <= GOP_SECONDS + 1e-6,
            gop,
            GOP_SECONDS,
            f"keyframes {gop} s apart; at most {GOP_SECONDS} s",
        )
    )
    checks.append(
        Check(
            "closed_gop",
            v.open_keyframes == 0,
            v.open_keyframes,
            0,
            f"{v.open_keyframes} keyframe(s) are not IDR pictures (open GOP)",
        )
    )
    if v.codec in TAGS:
        tag = TAGS[v.codec]
        checks.append(
            Check(
                "codec_tag",
                v.codec_tag == tag,
                v.codec_tag,
                tag,
                f"{v.codec} tagged {v.codec_tag!r}; Apple players need {tag!r}",
            )
        )
    if a is not None:
        start = round(v.start - a.start, 4)
        end = round(v.duration - a.duration, 4)
        checks.append(
            Check(
                "av_start_offset",
                abs(start) <= AV_TOLERANCE_S,
                start,
                AV_TOLERANCE_S,
                f"audio starts {-start * 1000:+.0f} ms from video; at most ±42 ms",
            )
        )
        checks.append(
            Check(
                "av_duration_offset",
                abs(end) <= AV_TOLERANCE_S,
                end,
                AV_TOLERANCE_S,
                f"audio and video lengths differ by {end * 1000:.0f} ms",
            )
        )
    return checks


LOUDNESS_TOLERANCE_LU = 1.0  # integrated loudness within this of the target


def loudness_checks(measured: LoudnessMeasure, target: Loudness | None) -> list[Check]:
    """A rendition's sound against the video's loudness target: integrated loudness within
    ±1 LU of it, true peak at or under its ceiling (no target: measured, not judged)."""
    if target is None:
        return []
    off = round(measured.integrated - target.integrated, 2)
    return [
        Check(
            "loudness_integrated",
            abs(off) <= LOUDNESS_TOLERANCE_LU,
            measured.integrated,
            {"target": target.integrated, "tolerance": LOUDNESS_TOLERANCE_LU},
            f"integrated loudness {measured.integrated:g} LUFS is {off:+g} LU from the "
            f"{target.integrated:g} LUFS target (at most ±{LOUDNESS_TOLERANCE_LU:g} LU)",
        ),
        Check(
            "true_peak",
            measured.true_peak <= target.true_peak,
            measured.true_peak,
            target.true_peak,
            f"true peak {measured.true_peak:g} dBTP is over the {target.true_peak:g} dBTP ceiling",
        ),
    ]


def content_checks(result: PassResult, limits: QcThresholds) -> list[Check]:
    black = [r for r in result.black if r[1] - r[0] >= limits.black_seconds]
    frozen = [r for r in result.frozen if r[1] - r[0] >= limits.freeze_seconds]
    return [
        Check(
            "black_frames",
            not black,
            _runs(black),
            f"< {limits.black_seconds} s",
            "black from " + ", ".join(f"{s:.2f} to {e:.2f} s" for s, e in black),
        ),
        Check(
            "frozen_frames",
            not frozen,
            _runs(frozen),
            f"< {limits.freeze_seconds} s",
            "frozen from " + ", ".join(f"{s:.2f} to {e:.2f} s" for s, e in frozen),
        ),
    ]


def fidelity(result: PassResult, subsample: int = 1) -> dict[str, Any]:
    series = result.per_frame
    summary: dict[str, Any] = {
        "source": result.fidelity_source,
        "psnr_kind": PSNR_KIND,
        "vmaf_available": result.vmaf_available,
        "subsample": subsample if result.vmaf_available else 1,
    }
    for name in ("psnr_y", "ssim", "vmaf"):
        values = [v for v in series.get(name, []) if v == v]
        finite = [min(v, 100.0) for v in values]  # identical frames: PSNR is infinite
        summary[name] = (
            {
                "mean": round(statistics.fmean(finite), 4),
                "min": round(min(finite), 4),
                "frames": len(finite),
            }
            if finite
            else None
        )
    if not result.vmaf_available:
        summary["vmaf"] = None
        summary["vmaf_note"] = "unavailable: this ffmpeg has no libvmaf (no number is invented)"
    return summary


def fidelity_checks(summary: dict[str, Any], limits: QcThresholds) -> list[Check]:
    checks = []
    for name, label, limit, unit in (
        ("psnr_y", "PSNR-Y", limits.min_psnr, " dB"),
        ("ssim", "SSIM", limits.min_ssim, ""),
        ("vmaf", "VMAF", limits.min_vmaf, ""),
    ):
        stats = summary.get(name)
        if stats is None:
            continue  # VMAF unavailable: reported, never judged on a made-up value
        mean = stats["mean"]
        checks.append(
            Check(
                name,
                mean >= limit,
                mean,
                limit,
                f"{label} {mean:.2f}{unit} (mean over frames) is below {limit}{unit}",
            )
        )
    return checks


def seam_checks(seams: list[SeamScore | dict[str, Any]]) -> list[Check]:
    checks = []
    for seam in seams:
        data = seam.to_dict() if isinstance(seam, SeamScore) else seam
        why = "; ".join(data.get("failures", []))
        checks.append(
            Check(
                f"seam_{data['seam']}",
                bool(data["passed"]),
                {k: data[k] for k in ("jump", "delta_e", "delta_l", "ssim_drop")},
                "docs/qc.md",
                f"seam at {data['seconds']:.2f} s (segment {data['seam']}): {why}",
            )
        )
    return checks


def drift_checks(drift: list[dict[str, Any]], limits: QcThresholds) -> list[Check]:
    """Within each scene: the colour cast, the brightness and the contrast may not wander."""
    checks = []
    for d in drift:
        scene = d["scene"]
        what = f"scene {scene}, segment {d['first_segment']} to {d['last_segment']}"
        checks.append(
            Check(
                f"drift_scene_{scene}",
                d["delta_e"] <= limits.drift_delta_e,
                d["delta_e"],
                limits.drift_delta_e,
                f"{what}: colour drifts ΔE {d['delta_e']:.1f} (at most {limits.drift_delta_e})",
            )
        )
        if "delta_l" in d:
            checks.append(
                Check(
                    f"brightness_scene_{scene}",
                    d["delta_l"] <= limits.drift_delta_l,
                    d["delta_l"],
                    limits.drift_delta_l,
                    f"{what}: brightness drifts ΔL {d['delta_l']:.1f} "
                    f"(at most {limits.drift_delta_l})",
                )
            )
            low, high = 1 / limits.drift_contrast, limits.drift_contrast
            checks.append(
                Check(
                    f"contrast_scene_{scene}",
                    low <= d["contrast"] <= high,
                    d["contrast"],
                    [round(low, 3), high],
                    f"{what}: contrast changes {d['contrast']:.2f}x (within {low:.2f}x to {high}x)",
                )
            )
    return checks


def failures_of(scope: str, checks: list[Check]) -> list[dict[str, str]]:
    return [
        {"check": f"{scope}.{c.name}" if scope else c.name, "why": c.to_dict()["why"]}
        for c in checks
        if not c.passed
    ]


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _tenths(value: float | None) -> str:
    return "?" if value is None else f"{value:.1f}"


def _runs(runs: list[tuple[float, float]]) -> list[list[float]]:
    return [[round(s, 3), round(e, 3)] for s, e in runs]
