"""The procedural generator: an honest CPU stand-in for a video model.

Deterministic in (prompt, seed, segment): the prompt picks a palette and a layout of soft
shapes that drift along smooth paths over a slowly turning gradient; the scene prompt is
written on the picture. Like a real model conditioned on a tail, a segment reproduces its
context frames (imperfectly: each segment's seed gives it a small colour cast and its own
grain, which is what the stitcher's alignment has to absorb) and then dissolves from the
last context frame into its own motion, so scene changes morph instead of cutting.
"""

from __future__ import annotations

import colorsys
import hashlib
import textwrap
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from factory.generate.base import Frames, PromptEmbedding, SegmentSpec

GRID = 4  # shapes are drawn on a grid this many times coarser, then upsampled
CAST_LEVELS = 6.0  # per-segment colour cast, in 8-bit levels (a model's drift)
GRAIN_LEVELS = 2.0


@dataclass(frozen=True)
class SceneLook:
    colors: np.ndarray  # [3, 3] float32 palette
    angle: float
    shapes: np.ndarray  # [n, 7]: x, y, radius, speed_x, speed_y, phase, colour index


class ProceduralGenerator:
    name = "procedural"
    carries_latents = False
    last_memory: dict[str, Any] | None = None

    def load(self, device: str) -> None:
        """Nothing to load; the procedural generator runs anywhere."""

    def encode_prompt(self, prompt: str, negative_prompt: str = "") -> PromptEmbedding:
        return PromptEmbedding(self.name, prompt, negative_prompt, _look(prompt))

    def generate(
        self, seg: SegmentSpec, prompt: PromptEmbedding, context: Frames | None, seed: int
    ) -> Frames:
        rng = np.random.default_rng(seed)
        look: SceneLook = prompt.data
        frames = np.empty((seg.frames, seg.height, seg.width, 3), np.float32)
        for j in range(seg.frames):
            frames[j] = _picture(look, seg.width, seg.height, (seg.first_frame + j) / seg.fps)
        if context is not None and len(context):
            _continue_from(frames, context.astype(np.float32), seg.context)
        frames += rng.uniform(-CAST_LEVELS, CAST_LEVELS, 3).astype(np.float32)
        frames += rng.normal(0, GRAIN_LEVELS, frames.shape[1:]).astype(np.float32)
        _caption(frames, prompt.prompt, seg.index)
        return np.clip(frames, 0, 255).astype(np.uint8)


def _look(prompt: str) -> SceneLook:
    digest = hashlib.sha256(prompt.encode()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "big"))
    hue = rng.random()
    hsv = [((hue + offset) % 1.0, 0.55 + 0.4 * rng.random(), 0.35 + 0.6 * rng.random())
           for offset in (0.0, 0.12, 0.5)]  # fmt: skip
    colors = np.array([colorsys.hsv_to_rgb(*c) for c in hsv], np.float32) * 255
    count = int(rng.integers(3, 6))
    shapes = np.column_stack([
        rng.random(count), rng.random(count), 0.08 + 0.15 * rng.random(count),
        rng.uniform(-0.15, 0.15, count), rng.uniform(-0.1, 0.1, count),
        rng.random(count) * 6.28, rng.integers(0, 3, count),
    ]).astype(np.float32)  # fmt: skip
    return SceneLook(colors=colors, angle=float(rng.random() * 6.28), shapes=shapes)


@lru_cache(maxsize=8)
def _grid(width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    gh, gw = -(-height // GRID), -(-width // GRID)
    cy, cx = np.mgrid[0:gh, 0:gw].astype(np.float32)
    return (cx + 0.5) / gw, (cy + 0.5) / gh


def _picture(look: SceneLook, width: int, height: int, t: float) -> np.ndarray:
    """One frame: drawn on a coarse grid, then smoothly upscaled (shapes are soft anyway)."""
    cx, cy = _grid(width, height)
    angle = look.angle + 0.15 * t
    ramp = np.clip(0.5 + (cx - 0.5) * np.cos(angle) + (cy - 0.5) * np.sin(angle), 0, 1)
    picture = look.colors[0] + ramp[..., None] * (look.colors[1] - look.colors[0])
    aspect = width / height
    for x, y, radius, vx, vy, phase, color in look.shapes:
        # Smooth closed paths (Lissajous), so nothing ever jumps from one edge to the other.
        px = x + 0.35 * np.sin(phase + 2.2 * vx * t) + 0.04 * np.sin(phase + 0.7 * t)
        py = y + 0.3 * np.sin(phase * 1.3 + 2.6 * vy * t) + 0.04 * np.cos(phase + 0.5 * t)
        d2 = ((cx - px) * aspect) ** 2 + (cy - py) ** 2
        blob = np.exp(-d2 / (2 * radius * radius))[..., None]
        picture = picture * (1 - blob) + np.minimum(look.colors[int(color)] * 1.1, 255) * blob
    small = Image.fromarray(np.clip(picture, 0, 255).astype(np.uint8))
    return np.asarray(small.resize((width, height), Image.Resampling.BILINEAR), np.float32)


def _continue_from(frames: np.ndarray, context: np.ndarray, overlap: int) -> None:
    """Reproduce the context over the overlap, then dissolve from its last frame."""
    overlap = min(overlap, len(context), len(frames))
    frames[:overlap] = context[-overlap:] if overlap else frames[:overlap]
    last = context[-1]
    fade = max(1, (len(frames) - overlap) // 2)
    for j in range(overlap, min(len(frames), overlap + fade)):
        w = 1.0 - (j - overlap + 1) / (fade + 1)
        frames[j] = w * last + (1 - w) * frames[j]


def _caption(frames: np.ndarray, text: str, segment: int) -> None:
    height, width = frames.shape[1:3]
    mask = _caption_mask(text, segment, width, height)
    if mask is None:
        return
    top, alpha = mask
    rows = slice(top, top + alpha.shape[0])
    region = frames[:, rows, :, :]
    region *= 1 - alpha[None, :, :, None] * 0.85
    region += alpha[None, :, :, None] * 0.85 * 250


@lru_cache(maxsize=32)
def _caption_mask(
    text: str, segment: int, width: int, height: int
) -> tuple[int, np.ndarray] | None:
    size = max(10, height // 22)
    font = ImageFont.load_default(size=size)
    chars = max(10, int(width / (size * 0.55)))
    lines = [*textwrap.wrap(text, chars)[:3], f"segment {segment}"]
    box_height = (size + 4) * len(lines) + 6
    if box_height >= height:
        return None
    image = Image.new("L", (width, box_height))
    draw = ImageDraw.Draw(image)
    for i, line in enumerate(lines):
        draw.text((8, 3 + i * (size + 4)), line, font=font, fill=255)
    return height - box_height, np.asarray(image, np.float32) / 255
