"""A small chart painter for the report's quality plot: panels stacked over one time axis,
each with lines, dashed limits, vertical stems with markers, shaded spans and a legend,
drawn with Pillow.

It replaces matplotlib for `quality.png`: every qc stage draws one, and matplotlib spent
0.3-0.6 s of CPU on each (ticks and text layout), a third of a short job's whole run; this
takes a few hundredths of a second.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from PIL import Image, ImageDraw, ImageFont

Colour = tuple[int, int, int]
PAPER, INK, GRID, FRAME = (255, 255, 255), (30, 30, 30), (232, 232, 232), (90, 90, 90)
# matplotlib's tab10, so lines keep the colours the plot always had
SERIES = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
          (140, 86, 75), (227, 119, 194), (127, 127, 127))  # fmt: skip
RED, GREEN, BLUE, BLACK = (214, 39, 40), (44, 160, 44), (31, 119, 180), (0, 0, 0)
WIDTH, PANEL_HEIGHT = 880, 200
LEFT, RIGHT, TOP, BOTTOM, GAP = 70, 14, 34, 44, 14


@dataclass
class Panel:
    """One panel: what is drawn in it, in data coordinates (x in seconds)."""

    ylabel: str
    lines: list[tuple[str, Colour, list[tuple[float, float]]]] = field(default_factory=list)
    limits: list[tuple[str, Colour, float]] = field(default_factory=list)  # dashed
    stems: list[tuple[float, float, Colour, str]] = field(default_factory=list)  # x, y, o|D
    bands: list[tuple[str | None, Colour, float, float, int]] = field(default_factory=list)
    note: str = ""  # shown in the middle where nothing else is
    legend_at: str = "lower left"  # or "upper left", "lower right"

    def ys(self) -> list[float]:
        values = [y for _, _, points in self.lines for _, y in points]
        values += [y for _, _, y in self.limits] + [y for _, y, _, _ in self.stems]
        values += [v for _, _, low, high, _ in self.bands for v in (low, high)]
        if self.stems:
            values.append(0.0)
        return [v for v in values if math.isfinite(v)]


def nice_ticks(low: float, high: float, count: int = 6) -> list[float]:
    """Round tick values (1, 2, 2.5 or 5 times a power of ten) within low..high."""
    if not math.isfinite(low) or not math.isfinite(high):
        return [0.0, 1.0]
    if high - low < 1e-9:
        low, high = low - 1, high + 1
    raw = (high - low) / max(1, count - 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.ceil(low / step - 1e-9) * step
    ticks, value = [], first
    while value <= high + step * 1e-6:
        ticks.append(round(value, 10))
        value += step
    return ticks


def label(value: float) -> str:
    return f"{value:g}" if abs(value) >= 1e-9 else "0"


class _Frame:
    """One panel's box on the canvas and its data-to-pixel mapping."""

    def __init__(self, box: tuple[int, int, int, int], x: tuple[float, float],
                 y: tuple[float, float]) -> None:  # fmt: skip
        self.box, self.x, self.y = box, x, y

    def px(self, x: float, y: float) -> tuple[float, float]:
        left, top, right, bottom = self.box
        fx = (x - self.x[0]) / ((self.x[1] - self.x[0]) or 1)
        fy = (y - self.y[0]) / ((self.y[1] - self.y[0]) or 1)
        return left + fx * (right - left), bottom - fy * (bottom - top)


def draw_chart(
    title: str,
    panels: Sequence[Panel],
    x_range: tuple[float, float],
    xlabel: str,
    spans: Sequence[tuple[float, float, Colour]] = (),
) -> bytes:
    """The panels stacked (a shared x axis labelled at the bottom), `spans` (x0, x1, colour)
    shaded across all of them; a PNG."""
    height = TOP + len(panels) * PANEL_HEIGHT + (len(panels) - 1) * GAP + BOTTOM
    image = Image.new("RGB", (WIDTH, height), PAPER)
    overlay = Image.new("RGBA", image.size, (0, 0, 0, 0))
    draw, shade = ImageDraw.Draw(image), ImageDraw.Draw(overlay)
    font, small = ImageFont.load_default(size=13), ImageFont.load_default(size=11)
    draw.text((WIDTH / 2, 10), title, fill=INK, font=font, anchor="mt")
    x_ticks = nice_ticks(*x_range, count=9)
    x_span = (min(x_ticks[0], x_range[0]), max(x_ticks[-1], x_range[1]))
    x_span = (
        x_span[0] - 0.02 * (x_span[1] - x_span[0]),
        x_span[1] + 0.02 * (x_span[1] - x_span[0]),
    )
    frames = []
    for i, panel in enumerate(panels):
        top = TOP + i * (PANEL_HEIGHT + GAP)
        box = (LEFT, top, WIDTH - RIGHT, top + PANEL_HEIGHT)
        ys = panel.ys() or [0.0, 1.0]
        pad = 0.05 * ((max(ys) - min(ys)) or 1)
        y_ticks = nice_ticks(min(ys) - pad, max(ys) + pad, count=6)
        frame = _Frame(box, x_span, (min(ys) - pad, max(ys) + pad))
        frames.append(frame)
        for x0, x1, colour in spans:
            (a, _), (b, _) = frame.px(x0, 0), frame.px(x1, 0)
            shade.rectangle((max(a, box[0]), box[1], min(b, box[2]), box[3]), fill=(*colour, 40))
        _panel(draw, shade, frame, panel, x_ticks, y_ticks, small,
               last=i == len(panels) - 1)  # fmt: skip
        _ylabel(image, panel.ylabel, box, font)
    image = Image.alpha_composite(image.convert("RGBA"), overlay).convert("RGB")
    draw = ImageDraw.Draw(image)
    for frame, panel in zip(frames, panels, strict=True):
        draw.rectangle(frame.box, outline=FRAME)
        _legend(draw, frame, panel, small)
    draw.text((WIDTH / 2, height - 14), xlabel, fill=INK, font=font, anchor="mb")
    out = io.BytesIO()
    image.save(out, format="PNG", compress_level=1)
    return out.getvalue()


def _panel(draw: ImageDraw.ImageDraw, shade: ImageDraw.ImageDraw, frame: _Frame, panel: Panel,
           x_ticks: list[float], y_ticks: list[float], font: ImageFont.FreeTypeFont, *,
           last: bool) -> None:  # fmt: skip
    left, top, right, bottom = frame.box
    for y in y_ticks:
        _, py = frame.px(0, y)
        if top <= py <= bottom:
            draw.line((left, py, right, py), fill=GRID)
            draw.line((left - 4, py, left, py), fill=FRAME)
            draw.text((left - 6, py), label(y), fill=INK, font=font, anchor="rm")
    for x in x_ticks:
        px, _ = frame.px(x, 0)
        if left <= px <= right:
            draw.line((px, bottom, px, bottom + 4), fill=FRAME)
            if last:
                draw.text((px, bottom + 6), label(x), fill=INK, font=font, anchor="mt")
    for _, colour, low, high, alpha in panel.bands:
        (_, a), (_, b) = frame.px(0, high), frame.px(0, low)
        shade.rectangle((left, max(a, top), right, min(b, bottom)), fill=(*colour, alpha))
    for _, colour, points in panel.lines:
        for run in _finite_runs(points):  # a value not measured (NaN) leaves a gap
            if len(run) > 1:
                draw.line([frame.px(x, y) for x, y in run], fill=colour, width=1)
            else:
                px, py = frame.px(*run[0])
                draw.ellipse((px - 2, py - 2, px + 2, py + 2), fill=colour)
    for _, colour, y in panel.limits:
        _, py = frame.px(0, y)
        for x in range(left, right, 9):
            draw.line((x, py, min(x + 5, right), py), fill=colour)
    for x, y, colour, marker in panel.stems:
        (px, py), (_, base) = frame.px(x, y), frame.px(x, 0)
        draw.line((px, base, px, py), fill=colour, width=2)
        if marker == "D":
            draw.polygon([(px, py - 6), (px + 6, py), (px, py + 6), (px - 6, py)], fill=colour)
        else:
            draw.ellipse((px - 4, py - 4, px + 4, py + 4), fill=colour)
    if panel.note:
        draw.text(((left + right) / 2, (top + bottom) / 2), panel.note, fill=INK, font=font,
                  anchor="mm")  # fmt: skip


def _finite_runs(points: list[tuple[float, float]]) -> list[list[tuple[float, float]]]:
    runs: list[list[tuple[float, float]]] = [[]]
    for x, y in points:
        if math.isfinite(x) and math.isfinite(y):
            runs[-1].append((x, y))
        elif runs[-1]:
            runs.append([])
    return [run for run in runs if run]


def _ylabel(image: Image.Image, text: str, box: tuple[int, int, int, int],
            font: ImageFont.FreeTypeFont) -> None:  # fmt: skip
    size = font.getbbox(text)
    strip = Image.new("RGB", (size[2] + 4, size[3] + 4), PAPER)
    ImageDraw.Draw(strip).text((2, 2), text, fill=INK, font=font)
    strip = strip.rotate(90, expand=True)
    image.paste(strip, (8, int((box[1] + box[3]) / 2 - strip.height / 2)))


def _legend(draw: ImageDraw.ImageDraw, frame: _Frame, panel: Panel,
            font: ImageFont.FreeTypeFont) -> None:  # fmt: skip
    entries = [(name, colour, "line") for name, colour, _ in panel.lines]
    entries += [(name, colour, "dash") for name, colour, _ in panel.limits if name]
    entries += [(name, colour, "band") for name, colour, _, _, _ in panel.bands if name]
    if not entries:
        return
    row = 15
    width = 34 + max(int(font.getlength(name)) for name, _, _ in entries)
    height = 6 + row * len(entries)
    left, top, right, bottom = frame.box
    x = left + 8 if "left" in panel.legend_at else right - 8 - width
    y = top + 8 if "upper" in panel.legend_at else bottom - 8 - height
    draw.rectangle((x, y, x + width, y + height), fill=PAPER, outline=GRID)
    for i, (name, colour, kind) in enumerate(entries):
        cy = y + 4 + row * i + row / 2
        if kind == "band":
            draw.rectangle((x + 6, cy - 4, x + 26, cy + 4), fill=(200, 230, 200))
        elif kind == "dash":
            draw.line((x + 6, cy, x + 12, cy), fill=colour)
            draw.line((x + 18, cy, x + 26, cy), fill=colour)
        else:
            draw.line((x + 6, cy, x + 26, cy), fill=colour, width=2)
        draw.text((x + 30, cy), name, fill=INK, font=font, anchor="lm")
