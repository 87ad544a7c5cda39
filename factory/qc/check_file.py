"""`factory qc VIDEO`: the quality gate's checks on any file, with an optional reference (for
PSNR, SSIM and VMAF) and optional seam times (for seam and drift scores)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from factory.errors import BadInput
from factory.media.analyze import PassResult, Reference, analyze
from factory.media.frames import frames_at, window
from factory.media.probe import Probe, probe
from factory.qc import gate, pictures, report
from factory.qc.basic import probe_summary
from factory.qc.seams import WINDOW, SeamScore, drift_delta_e, mean_lab, score_seam
from factory.qc.thresholds import QcThresholds

DRIFT_SAMPLES = 8


def check_file(
    path: Path,
    *,
    reference: Path | None = None,
    seams_at: list[float] | None = None,
    overlap: int = 0,
    limits: QcThresholds | None = None,
    out_dir: Path | None = None,
) -> dict[str, Any]:
    limits = limits or QcThresholds()
    if not path.is_file():
        raise BadInput(f"{path} is not a file", field="VIDEO")
    if reference is not None and not reference.is_file():
        raise BadInput(f"{reference} is not a file", field="--reference")
    subject = {"file": str(path), "reference": str(reference) if reference else None}
    facts = _probe(path)
    if isinstance(facts, str):  # the container does not open: a failed check, not bad input
        opens = gate.Check("opens", False, False, True, f"cannot be opened as a video: {facts}")
        return _document(subject, {"checks": [opens]}, [], [], limits, {})
    if facts.video is None:
        raise BadInput(f"{path} has no video stream", field="VIDEO")
    v = facts.video
    fps, duration = v.fps, v.duration
    ref, expected = _reference(reference, v.frames)
    with tempfile.TemporaryDirectory(prefix="factory-qc-") as scratch:
        measured = analyze(
            {"video": path},
            fps,
            duration,
            reference=ref,
            work=Path(scratch),
            subsample=limits.vmaf_subsample,
        )["video"]
    rendition = _rendition(facts, measured, expected, ref, limits)
    seams, seam_pictures, drift = [], [], []
    if seams_at and measured.decoded_ok:
        seams, seam_pictures = _seams(path, seams_at, overlap, fps, v.frames, limits)
        drift = _drift(path, seams_at, fps, v.frames)
    images: dict[str, str] = {}
    if out_dir is not None:
        images = _pictures(
            out_dir, path.name, fps, measured, rendition["content"], seams, seam_pictures, limits
        )
    return _document(subject, rendition, seams, drift, limits, images)


def _reference(reference: Path | None, frames: int) -> tuple[Reference | None, int]:
    """The reference to compare against (None without one) and the frames expected: the
    reference's count, or the video's own without a reference."""
    if reference is None:
        return None, frames
    ref_facts = _probe(reference)
    if isinstance(ref_facts, str) or ref_facts.video is None:
        raise BadInput(f"{reference} is not a readable video", field="--reference")
    ref = Reference([(reference, None)], ref_facts.video.width, ref_facts.video.height)
    return ref, ref_facts.video.frames


def _rendition(
    facts: Probe,
    measured: PassResult,
    expected: int,
    ref: Reference | None,
    limits: QcThresholds,
) -> dict[str, Any]:
    """The video's checks (decode, truncation, streams, content, fidelity), its fidelity
    numbers, its black and frozen runs, and its probe summary."""
    fidelity = (
        gate.fidelity(measured, limits.vmaf_subsample)
        if ref is not None and measured.decoded_ok
        else None
    )
    checks = [
        *gate.decode_checks(measured, expected),
        *gate.truncation_checks(facts, measured),
        *gate.stream_checks(facts),
        *gate.content_checks(measured, limits),
        *(gate.fidelity_checks(fidelity, limits) if fidelity else []),
    ]
    content = {
        "black": [[round(s, 3), round(e, 3)] for s, e in measured.black],
        "frozen": [[round(s, 3), round(e, 3)] for s, e in measured.frozen],
    }
    return {
        "checks": checks,
        "fidelity": fidelity,
        "content": content,
        "probe": probe_summary(facts),
    }


def _pictures(
    out_dir: Path,
    title: str,
    fps: float,
    measured: PassResult,
    content: dict[str, list[list[float]]],
    seams: list[dict[str, Any]],
    seam_pictures: list[pictures.SeamPicture],
    limits: QcThresholds,
) -> dict[str, str]:
    """Write the contact sheet and the quality plot into `out_dir`; gives their names."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "contact.png").write_bytes(pictures.contact_sheet(title, seam_pictures))
    failing = {
        k: [
            r
            for r in runs
            if r[1] - r[0] >= (limits.black_seconds if k == "black" else limits.freeze_seconds)
        ]
        for k, runs in content.items()
    }
    plot = pictures.quality_plot(
        title, fps, {"video": measured.per_frame}, seams, limits.to_dict(), failing
    )
    (out_dir / "quality.png").write_bytes(plot)
    return {"contact": "contact.png", "quality": "quality.png"}


def _document(
    subject: dict[str, Any],
    rendition: dict[str, Any],
    seams: list[dict[str, Any]],
    drift: list[dict[str, Any]],
    limits: QcThresholds,
    images: dict[str, str],
) -> dict[str, Any]:
    return report.build(
        subject,
        {"video": rendition},
        seams=seams,
        seam_checks=gate.seam_checks(seams),
        drift=drift,
        drift_checks=[],
        segment_checks=[],
        limits=limits,
        images=images,
    )


def _probe(path: Path) -> Probe | str:
    try:
        return probe(path)
    except Exception as error:  # PyAV raises its own errors for broken containers
        return f"{type(error).__name__}: {error}"


def _seams(
    path: Path, seams_at: list[float], overlap: int, fps: float, frames: int, limits: QcThresholds
) -> tuple[list[dict[str, Any]], list[pictures.SeamPicture]]:
    marks = sorted(round(t * fps) for t in seams_at)
    bad = [t for t, f in zip(sorted(seams_at), marks, strict=True) if not 1 <= f < frames - 1]
    if bad:
        raise BadInput(f"{bad[0]} s is not inside the video", field="--seams")
    wanted = {i for f in marks for i in range(f - WINDOW, f + overlap + WINDOW + 1)}
    found = frames_at(path, wanted)
    seams, seam_pictures = [], []
    for number, frame in enumerate(marks, start=1):
        before = window(found, max(0, frame - WINDOW), frame)
        after = window(found, frame, min(frames, frame + overlap + WINDOW + 1))
        score: SeamScore = score_seam(
            before, after, overlap, seam=number, frame=frame, fps=fps, limits=limits
        )
        seams.append(score.to_dict())
        seam_pictures.append(pictures.SeamPicture(score.to_dict(), before[-1], after[overlap]))
    return seams, seam_pictures


def _drift(path: Path, seams_at: list[float], fps: float, frames: int) -> list[dict[str, Any]]:
    """Colour drift from the first segment to the last (frames sampled from each)."""
    first_end, last_start = round(min(seams_at) * fps), round(max(seams_at) * fps)
    sample = {
        *np.linspace(0, first_end - 1, DRIFT_SAMPLES).astype(int),
        *np.linspace(last_start, frames - 1, DRIFT_SAMPLES).astype(int),
    }
    found = frames_at(path, sample)
    first = np.stack([found[i] for i in sorted(found) if i < first_end])
    last = np.stack([found[i] for i in sorted(found) if i >= last_start])
    delta = drift_delta_e(mean_lab(first), mean_lab(last))
    # Reported, not judged: in an arbitrary file the picture may change on purpose (a pan, a
    # cut); the pipeline judges drift within each scene of a generated video.
    return [
        {
            "scene": 0,
            "first_segment": 0,
            "last_segment": len(seams_at),
            "delta_e": round(delta, 3),
            "judged": False,
        }
    ]
