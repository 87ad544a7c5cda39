"""The report's pictures: `contact.png` (the frames either side of every seam, with its scores)
and `quality.png` (per-frame fidelity and the seam scores over time)."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from factory.qc import chart

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
    sheet.save(out, format="PNG", compress_level=1)  # a quarter of the time of level 6, +14 %
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
    panels = [
        _fidelity_panel(fps, renditions, key, label, limits.get(limit))
        for key, label, limit in (
            ("vmaf", "VMAF", "min_vmaf"),
            ("psnr_y", "PSNR-Y (dB)", "min_psnr"),
            ("ssim", "SSIM", "min_ssim"),
        )
    ]
    panels.append(_seam_panel(seams, limits))
    if loudness:
        panels.append(_loudness_panel(loudness))
    spans = [(start, max(end, start + 1 / fps), colour)
             for kind, colour in (("black", chart.BLACK), ("frozen", chart.BLUE))
             for start, end in (defects or {}).get(kind, [])]  # fmt: skip
    xs = [x for panel in panels for _, _, points in panel.lines for x, _ in points]
    xs += [x for panel in panels for x, _, _, _ in panel.stems] + [end for _, end, _ in spans]
    end = max([1 / fps, *(x for x in xs if math.isfinite(x))])
    return chart.draw_chart(title, panels, (0.0, end), "seconds", spans)


def _loudness_panel(loudness: dict[str, dict[str, Any]]) -> chart.Panel:
    """Short-term loudness of each rendition's sound in time, its integrated loudness and
    true peak in the legend, and the target's ±1 LU band where there is one."""
    panel = chart.Panel("loudness (LUFS, 3 s)", legend_at="lower right")
    target = None
    for i, (name, measured) in enumerate(loudness.items()):
        points = [(t, v) for t, v in measured.get("short_term", []) if v > -70]
        label = (f"{name}: {measured['integrated']:g} LUFS, LRA {measured['range']:g} LU, "
                 f"peak {measured['true_peak']:g} dBTP")  # fmt: skip
        colour = chart.SERIES[i % len(chart.SERIES)]
        panel.lines.append((label if points else label + " (silent)", colour, points))
        target = measured.get("target", target)
    if target is not None:
        panel.bands.append((f"target {target:g} LUFS ±1 LU", chart.GREEN, target - 1,
                            target + 1, 40))  # fmt: skip
    return panel


def _fidelity_panel(fps: float, renditions: dict[str, dict[str, list[float]]], key: str,
                    label: str, limit: float | None) -> chart.Panel:  # fmt: skip
    """One metric's panel: a line per rendition measured, with the gate's limit; a note
    where nothing was measured."""
    panel = chart.Panel(label)
    for i, (name, series) in enumerate(renditions.items()):
        values = series.get(key) or []
        if not values:
            continue
        frames = series.get("frame") or list(range(len(values)))
        points = [(f / fps, min(v, 100.0)) for f, v in zip(frames, values, strict=False)]
        panel.lines.append((name, chart.SERIES[i % len(chart.SERIES)], points))
    if limit is not None and panel.lines:
        panel.limits.append((f"limit {limit}", chart.RED, limit))
    if not panel.lines:
        panel.note = "not measured (no reference, or unavailable)"
    return panel


def _seam_panel(seams: Sequence[dict[str, Any]], limits: dict[str, float]) -> chart.Panel:
    """The seams' jump scores at their times (green passed, red failed, diamonds a new
    scene), with the gate's limit; a note where there are no seams."""
    panel = chart.Panel("seam jump", legend_at="upper left")
    for s in seams:
        colour = chart.GREEN if s["passed"] else chart.RED
        panel.stems.append((s["seconds"], s["jump"], colour, "D" if s.get("scene_change") else "o"))
    if not seams:
        panel.note = "no seams"
    elif "seam_jump" in limits:
        panel.limits.append((f"limit {limits['seam_jump']} (diamonds: new scene, x3)", chart.RED,
                             limits["seam_jump"]))  # fmt: skip
    return panel
