"""`factory qc VIDEO`: the quality gate on any file. Exit 0 when it passes, 3 when a check
fails (the JSON names each failed check and why), 2 for bad input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from factory.cli import common
from factory.cli.common import out
from factory.errors import BadInput

FAILED_CHECK_EXIT = 3


def register(app: typer.Typer) -> None:
    app.command("qc")(qc)


def qc(
    video: Path = typer.Argument(..., help="The video file to check."),
    reference: Path | None = typer.Option(
        None, "--reference", help="The source it was encoded from: adds PSNR-Y, SSIM, VMAF."
    ),
    seams: str | None = typer.Option(
        None, "--seams", help="Seam times in seconds, comma-separated: adds seam and drift scores."
    ),
    overlap: int = typer.Option(
        0, "--overlap", min=0, max=256, help="Cross-faded frames after each seam."
    ),
    out_dir: Path | None = typer.Option(
        None, "--out", help="Write contact.png and quality.png here."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report (schema factory.qc/2)."),
) -> None:
    """Check one video like the quality gate does: decoding, frames, GOP, hvc1, A/V sync, black
    and frozen runs; fidelity against --reference; seams at --seams."""
    from factory.qc.check_file import check_file

    seam_times = _seam_times(seams) if seams else None
    limits = common.settings().qc
    document = check_file(
        video,
        reference=reference,
        seams_at=seam_times,
        overlap=overlap,
        limits=limits,
        out_dir=out_dir,
    )
    if as_json:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        _print(document)
    if not document["passed"]:
        raise typer.Exit(FAILED_CHECK_EXIT)


def _seam_times(raw: str) -> list[float]:
    try:
        values = [float(part) for part in raw.split(",") if part.strip()]
    except ValueError:
        raise BadInput(f"{raw!r} is not a list of seconds like 4.0,8.0", field="--seams") from None
    if not values or any(v <= 0 or v != v for v in values):
        raise BadInput(f"{raw!r}: seam times must be positive seconds", field="--seams")
    return values


def _print(document: dict) -> None:
    verdict = "passed" if document["passed"] else "FAILED"
    out.print(f"{document['file']}: {verdict}")
    rendition = document["renditions"]["video"]
    fidelity = rendition.get("fidelity")
    if fidelity:
        parts = []
        for key, label in (("vmaf", "VMAF"), ("psnr_y", "PSNR-Y"), ("ssim", "SSIM")):
            stats = fidelity.get(key)
            parts.append(f"{label} {stats['mean']:.2f}" if stats else f"{label} unavailable")
        out.print("  " + ", ".join(parts) + f" ({fidelity['source']})")
    for seam in document["seams"]:
        mark = "ok" if seam["passed"] else "BAD"
        out.print(
            f"  seam {seam['seam']} at {seam['seconds']:.2f} s: jump {seam['jump']:.2f}, "
            f"dE {seam['delta_e']:.1f}, SSIM drop {seam['ssim_drop']:.3f} [{mark}]",
            markup=False,
        )
    for failure in document["failures"]:
        out.print(f"  {failure['check']}: {failure['why']}", markup=False)
