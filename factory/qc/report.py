"""The QC report, schema `factory.qc/2` (docs/qc.md): one JSON document per video with every
check (value, limit, and why it failed), per-rendition fidelity, seams, drift and content
defects, plus the names of its pictures."""

from __future__ import annotations

from typing import Any

from factory.qc.gate import SCHEMA, Check, failures_of
from factory.qc.thresholds import QcThresholds


def build(
    subject: dict[str, Any],
    renditions: dict[str, dict[str, Any]],
    *,
    seams: list[dict[str, Any]],
    seam_checks: list[Check],
    drift: list[dict[str, Any]],
    drift_checks: list[Check],
    segment_checks: list[Check],
    limits: QcThresholds,
    images: dict[str, str],
    cuts: list[dict[str, Any]] | None = None,
    cut_checks: list[Check] | None = None,
) -> dict[str, Any]:
    """`renditions`: name -> {"checks": [Check], "fidelity": {...} | None, "probe": {...}}."""
    failures: list[dict[str, str]] = []
    rendered = {}
    for name, result in renditions.items():
        checks: list[Check] = result["checks"]
        failures += failures_of(name, checks)
        rendered[name] = {
            "passed": all(c.passed for c in checks),
            "checks": [c.to_dict() for c in checks],
            "fidelity": result.get("fidelity"),
            "content": result.get("content"),
            "probe": result.get("probe"),
            **({"loudness": result["loudness"]} if "loudness" in result else {}),
        }
    failures += failures_of("seams", seam_checks)
    failures += failures_of("drift", drift_checks)
    failures += failures_of("segments", segment_checks)
    failures += failures_of("cuts", cut_checks or [])
    return {
        "schema": SCHEMA,
        **subject,
        "passed": not failures,
        "failures": failures,
        "thresholds": limits.to_dict(),
        "renditions": rendered,
        "seams": seams,
        "cuts": cuts or [],
        "drift": drift,
        "segments": [c.to_dict() for c in segment_checks],
        "images": images,
    }


def summary(document: dict[str, Any]) -> dict[str, Any]:
    """The compact form kept in the job's progress and shown by `factory status`."""
    fidelity = {}
    for name, rendition in document["renditions"].items():
        f = rendition.get("fidelity") or {}
        fidelity[name] = {key: (f.get(key) or {}).get("mean") for key in ("vmaf", "psnr_y", "ssim")}
    seams = document["seams"]
    return {
        "passed": document["passed"],
        "failures": [f"{f['check']}: {f['why']}" for f in document["failures"][:10]],
        "fidelity": fidelity,
        "seams": len(seams),
        "worst_seam_jump": max((s["jump"] for s in seams), default=None),
        "regenerations": sum(s.get("regenerations", 0) for s in seams),
    }
