"""The report's pictures: `contact.png` (the frames either side of every seam, with its scores)
and `quality.png` (per-frame fidelity and the seam scores over time)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

THUMB_WIDTH = 240
SHEET_TOP, ROW_GAP = 40, 12  # the contact sheet's title band; space between its rows
PASS, FAIL, INK, PAPER = (40, 160, 70), (210, 40, 40), (20, 20, 20), (250, 250, 248)
CUT, TRANSITION = (40, 90, 200), (150, 60, 190)  # a clean cut's border, a transition's


@dataclass
class SeamPicture:
    seam: dict[str, Any]  # a SeamScore as a dict
    before: np.ndarray  # the last frame before the seam
    after: np.ndarray  # the first frame after its transition


@dataclass
class CutPicture:
    """A cut or a transition (factory/qc/cuts.py): its rows follow the seams', marked as
    what they are, not as seams."""

    cut: dict[str, Any]  # a CutScore as a dict, or a judged transition
    before: np.ndarray  # the last frame of the shot before
    after: np.ndarray  # the first frame of the shot after


def thumbnails(first: np.ndarray, last: np.ndarray) -> bytes:
    """A segment's first frame after its seam and its last written frame (see thumb_strip)."""
    return thumb_strip([first, last])


def read_thumbnails(data: bytes) -> dict[str, np.ndarray]:
    first, last = read_strip(data, 2)
    return {"first": first, "last": last}


def thumb_strip(frames: Sequence[np.ndarray]) -> bytes:
    """Frames shrunk to the contact sheet's width and stacked in one small PNG (byte-for-byte
    deterministic): what the sheet shows, kept so that it needs no decoding later."""
    out = io.BytesIO()
    stacked = np.concatenate([np.asarray(_thumb(frame)) for frame in frames])
    Image.fromarray(stacked).save(out, format="PNG", compress_level=1)
    return out.getvalue()


def read_strip(data: bytes, count: int) -> list[np.ndarray]:
    stacked = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    height = stacked.shape[0] // count
    return [stacked[i * height : (i + 1) * height] for i in range(count)]


def _thumb(frame: np.ndarray) -> Image.Image:
    image = Image.fromarray(frame)
    height = max(1, round(image.height * THUMB_WIDTH / image.width))
    return image.resize((THUMB_WIDTH, height), Image.Resampling.BILINEAR)


def contact_sheet(
    title: str, seams: Sequence[SeamPicture], cuts: Sequence[CutPicture] = ()
) -> bytes:
    """A row per seam, then a row per cut or transition (a dashed or dotted border in their
    own colours): the console cuts rows out of it by their order (`sheet_frames`)."""
    font = ImageFont.load_default(size=14)
    small = ImageFont.load_default(size=12)
    first = seams[0].before if seams else cuts[0].before if cuts else None
    thumb_h = _thumb(first).height if first is not None else 0
    row_h = thumb_h + ROW_GAP
    text_w = 330
    width = 2 * THUMB_WIDTH + text_w + 40
    height = SHEET_TOP + max(1, len(seams) + len(cuts)) * row_h
    sheet = Image.new("RGB", (width, height), PAPER)
    draw = ImageDraw.Draw(sheet)
    draw.text((10, 10), title, fill=INK, font=font)
    if not seams and not cuts:
        draw.text((10, 44), "one segment: no seams", fill=INK, font=small)
    for i, cut in enumerate(cuts):
        _cut_row(sheet, draw, SHEET_TOP + (len(seams) + i) * row_h, thumb_h, cut, small)
    for i, picture in enumerate(seams):
        top = SHEET_TOP + i * row_h
        data = picture.seam
        colour = PASS if data["passed"] else FAIL
        draw.rectangle(_frames_box(top, thumb_h), fill=colour)
        sheet.paste(_thumb(picture.before), (10, top))
        sheet.paste(_thumb(picture.after), (18 + THUMB_WIDTH, top))
        x = 34 + 2 * THUMB_WIDTH
        lines = [
            f"seam {data['seam']} at {data['seconds']:.2f} s"
            + ("  (new scene)" if data.get("scene_change") else ""),
            f"jump {data['jump']:.2f}   dE {data['delta_e']:.1f}   dL {data['delta_l']:.1f}",
            f"SSIM {data['ssim']:.3f} (drop {data['ssim_drop']:.3f})",
            ("passed" if data["passed"] else "FAILED: " + "; ".join(data.get("failures", [])))
            + (f"  after {data['regenerations']} new seed(s)" if data.get("regenerations") else ""),
        ]
        for j, line in enumerate(lines):
            fill = colour if j == 3 else INK
            draw.text((x, top + 4 + j * 18), line[:60], fill=fill, font=small)
    out = io.BytesIO()
    sheet.save(out, format="PNG")
    return out.getvalue()


def _cut_row(sheet: Image.Image, draw: ImageDraw.ImageDraw, top: int, thumb_h: int,
             picture: CutPicture, font: Any) -> None:  # fmt: skip
    data = picture.cut
    transition = data.get("transition")
    colour = (TRANSITION if transition else CUT) if data["passed"] else FAIL
    left, upper, right, lower = _frames_box(top, thumb_h)
    dash, gap = (2, 6) if transition else (6, 12)  # dotted: a transition; dashed: a cut
    for x in range(left, right, gap):
        draw.rectangle((x, upper, min(x + dash, right), lower), fill=colour)
    sheet.paste(_thumb(picture.before), (10, top))
    sheet.paste(_thumb(picture.after), (18 + THUMB_WIDTH, top))
    if transition:
        psnr = "not sampled" if data["psnr_y"] is None else f"{data['psnr_y']:.1f} dB"
        lines = [
            f"{transition.upper()} before segment {data['cut']} at {data['seconds']:.2f} s",
            f"{data['frames']} frames; PSNR-Y against the blend {psnr}",
            "blended" if data["passed"] else "FAILED: " + "; ".join(data.get("failures", [])),
        ]
    else:
        blend = "shots alike" if data["blend"] is None else f"blend ratio {data['blend']:.3f}"
        lines = [
            f"CUT before segment {data['cut']} at {data['seconds']:.2f} s",
            f"jump (luma MSE) {data['jump']:.1f}   {blend}",
            "clean" if data["passed"] else "FAILED: " + "; ".join(data.get("failures", [])),
        ]
    x = 34 + 2 * THUMB_WIDTH
    for j, line in enumerate(lines):
        draw.text((x, top + 4 + j * 18), line[:60], fill=colour if j == 2 else INK, font=font)


def sheet_frames(sheet: bytes, row: int, rows: int) -> bytes | None:
    """Row `row` (0-based) of a contact sheet of `rows` seams: its two frames in their pass or
    fail border, as a PNG (the console's grid of seams). None if the sheet has another shape."""
    image = Image.open(io.BytesIO(sheet))
    row_h, spare = divmod(image.height - SHEET_TOP, max(1, rows))
    if spare or not 0 <= row < rows or row_h <= ROW_GAP:
        return None
    box = _frames_box(SHEET_TOP + row * row_h, row_h - ROW_GAP)
    out = io.BytesIO()
    image.crop((box[0], box[1], box[2] + 1, box[3] + 1)).save(out, format="PNG")
    return out.getvalue()


def _frames_box(top: int, thumb_h: int) -> tuple[int, int, int, int]:
    return 6, top - 4, 14 + 2 * THUMB_WIDTH + 8, top + thumb_h + 4


def quality_plot(
    title: str,
    fps: float,
    renditions: dict[str, dict[str, list[float]]],
    seams: Sequence[dict[str, Any]],
    limits: dict[str, float],
    defects: dict[str, list[list[float]]] | None = None,
    loudness: dict[str, dict[str, Any]] | None = None,
) -> bytes:
    """Per-frame VMAF, PSNR-Y and SSIM of each rendition, and the seam jump scores, in time;
    black and frozen runs that fail the gate are shaded; with `loudness` (per rendition, as
    qc.json has it), a panel of short-term loudness with the target's ±1 LU band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = 5 if loudness else 4
    figure, axes = plt.subplots(rows, 1, figsize=(11, 2.5 * rows), sharex=True,
                                constrained_layout=True)  # fmt: skip
    panels = (
        ("vmaf", "VMAF", limits.get("min_vmaf")),
        ("psnr_y", "PSNR-Y (dB)", limits.get("min_psnr")),
        ("ssim", "SSIM", limits.get("min_ssim")),
    )
    for axis, (key, label, limit) in zip(axes, panels, strict=False):
        _fidelity_panel(axis, fps, renditions, key, label, limit)
    seam_axis = axes[3]
    _seam_panel(seam_axis, seams, limits)
    _shade_defects(axes, fps, defects)
    seam_axis.set_ylabel("seam jump")
    if loudness:
        _loudness_panel(axes[4], loudness)
    axes[-1].set_xlabel("seconds")
    figure.suptitle(title)
    out = io.BytesIO()
    figure.savefig(out, format="png", dpi=80)
    plt.close(figure)
    return out.getvalue()


def _loudness_panel(axis: Any, loudness: dict[str, dict[str, Any]]) -> None:
    """Short-term loudness of each rendition's sound in time, its integrated loudness and
    true peak in the legend, and the target's ±1 LU band where there is one."""
    target = None
    for name, measured in loudness.items():
        points = [(t, v) for t, v in measured.get("short_term", []) if v > -70]
        label = (f"{name}: {measured['integrated']:g} LUFS, LRA {measured['range']:g} LU, "
                 f"peak {measured['true_peak']:g} dBTP")  # fmt: skip
        if points:
            axis.plot(*zip(*points, strict=True), label=label, linewidth=1)
        else:
            axis.plot([], [], label=label + " (silent)")
        target = measured.get("target", target)
    if target is not None:
        axis.axhspan(target - 1, target + 1, color="green", alpha=0.15,
                     label=f"target {target:g} LUFS ±1 LU")  # fmt: skip
    axis.set_ylabel("loudness (LUFS, 3 s)")
    axis.legend(loc="lower right", fontsize="small")


def _fidelity_panel(
    axis: Any,
    fps: float,
    renditions: dict[str, dict[str, list[float]]],
    key: str,
    label: str,
    limit: float | None,
) -> None:
    """One metric's panel: a line per rendition measured, with the gate's limit; a note
    where nothing was measured."""
    drawn = False
    for name, series in renditions.items():
        values = series.get(key) or []
        if not values:
            continue
        frames = series.get("frame") or list(range(len(values)))
        seconds = [f / fps for f in frames]
        axis.plot(seconds, [min(v, 100.0) for v in values], label=name, linewidth=1)
        drawn = True
    if limit is not None and drawn:
        axis.axhline(limit, color="red", linestyle="--", linewidth=1, label=f"limit {limit}")
    if not drawn:
        axis.text(
            0.5,
            0.5,
            "not measured (no reference, or unavailable)",
            transform=axis.transAxes,
            ha="center",
            va="center",
        )
    axis.set_ylabel(label)
    if drawn:
        axis.legend(loc="lower left", fontsize=8)


def _seam_panel(seam_axis: Any, seams: Sequence[dict[str, Any]], limits: dict[str, float]) -> None:
    """The seams' jump scores at their times (green passed, red failed, diamonds a new
    scene), with the gate's limit; a note where there are no seams."""
    if seams:
        times = [s["seconds"] for s in seams]
        jumps = [s["jump"] for s in seams]
        colours = ["tab:green" if s["passed"] else "tab:red" for s in seams]
        markers = ["D" if s.get("scene_change") else "o" for s in seams]
        seam_axis.vlines(times, 0, jumps, colors=colours)
        for t, j, c, m in zip(times, jumps, colours, markers, strict=True):
            seam_axis.scatter([t], [j], c=[c], marker=m, zorder=3)
        if "seam_jump" in limits:
            seam_axis.axhline(
                limits["seam_jump"],
                color="red",
                linestyle="--",
                linewidth=1,
                label=f"limit {limits['seam_jump']} (diamonds: new scene, x3)",
            )
            seam_axis.legend(loc="upper left", fontsize=8)
    else:
        seam_axis.text(0.5, 0.5, "no seams", transform=seam_axis.transAxes, ha="center")


def _shade_defects(axes: Any, fps: float, defects: dict[str, list[list[float]]] | None) -> None:
    """Shade the failing black (black) and frozen (blue) runs across every panel."""
    for kind, colour in (("black", "black"), ("frozen", "tab:blue")):
        for start, end in (defects or {}).get(kind, []):
            for axis in axes:
                axis.axvspan(start, max(end, start + 1 / fps), color=colour, alpha=0.15)
