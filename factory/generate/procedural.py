"""The procedural generator: an honest CPU stand-in for a video model.

Deterministic in (prompt, seed, segment): the prompt picks a palette and a layout of soft
shapes that drift along smooth paths over a slowly turning gradient; the scene prompt is
written on the picture. Like a real model conditioned on a tail, a segment reproduces its
context frames (imperfectly: each segment's seed gives it a small colour cast and its own
grain, which is what the stitcher's alignment has to absorb) and then dissolves from the
last context frame into its own motion, so scene changes morph instead of cutting.

A scene's picture (SegmentSpec.image) is honoured visibly, as an image-conditioned model
would: it replaces the gradient as the scene's backdrop (slowly pushed in), the shapes take
their colours from it (its darkest, middle and brightest thirds) and drift over it; a first
frame is also the segment's frame 0 as given (only the grain added: the colour cast and the
caption grow in as the shapes do). A camera-move template (SegmentSpec.control_track) moves
the whole picture as the template's content moves, by `strength` of it.
"""

from __future__ import annotations

import colorsys
import hashlib
import math
import textwrap
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

import numpy as np
from PIL import Image, ImageChops, ImageDraw, ImageFont

from factory.generate.base import Frames, PromptEmbedding, SegmentSpec

GRID = 4  # shapes are drawn on a grid this many times coarser, then upsampled
CAST_LEVELS = 6.0  # per-segment colour cast, in 8-bit levels (a model's drift)
GRAIN_LEVELS = 2.0
PUSH_IN = 0.015  # a scene's picture is pushed in by this much a second (about its centre),
PUSH_MAX = 0.15  # slowing so it never passes this: a picture late in a long video stays whole
PUSH_STEP_PX = 0.5  # the push-in is resampled exactly where it has moved this far at an edge


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
        backdrop = None
        if seg.image is not None:
            look = replace(look, colors=_palette(seg.image))
            backdrop = _Backdrop.of(seg.image, seg.width, seg.height, seg.fps)
        frames = np.empty((seg.frames, seg.height, seg.width, 3), np.float32)
        for j in range(seg.frames):
            t = (seg.first_frame + j) / seg.fps
            dx = dy = 0
            if seg.control_track is not None:  # the camera move: the content goes where it goes
                move = seg.control_track[j] * seg.control_strength
                dx, dy = round(float(move[0])), round(float(move[1]))
            picture = (_picture(look, seg.width, seg.height, t) if backdrop is None
                       else _over_backdrop(look, backdrop, seg.first_frame + j))  # fmt: skip
            _moved(picture, dx, dy, out=frames[j])
        # How much of its own cast and caption each frame shows: all of it, but from a first
        # frame, which shows the picture as given and grows into the scene's look.
        own = np.ones(seg.frames, np.float32)
        if context is not None and len(context):
            moves = None
            if seg.control_track is not None and seg.context:  # the held frame pans on too
                since = seg.control_track - seg.control_track[seg.context - 1]
                moves = np.rint(since * seg.control_strength).astype(int)
            _continue_from(frames, context.astype(np.float32), seg.context, moves)
        elif seg.image is not None and seg.image_role == "first-frame":
            fade = _continue_from(frames, seg.image[None].astype(np.float32), 1)
            own = np.clip(np.arange(seg.frames, dtype=np.float32) / (fade + 1), 0, 1)
        cast = rng.uniform(-CAST_LEVELS, CAST_LEVELS, 3).astype(np.float32)
        frames += own[:, None, None, None] * cast
        frames += rng.normal(0, GRAIN_LEVELS, frames.shape[1:]).astype(np.float32)
        _caption(frames, prompt.prompt, seg.index, own)
        return np.clip(frames, 0, 255, out=frames).astype(np.uint8)


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


@dataclass(frozen=True)
class _Backdrop:
    """A scene's picture, prepared once a segment: at the frame's size, on the coarse grid,
    and its push-in resampled exactly every `step` frames (of the video, so every segment
    of the scene resamples at the same frames)."""

    full: Image.Image
    small: Image.Image
    fps: int
    step: int
    pushed: dict[int, Image.Image] = field(default_factory=dict)  # the last two resampled

    @staticmethod
    def of(image: np.ndarray, width: int, height: int, fps: int) -> _Backdrop:
        picture = image if image.dtype == np.uint8 else np.clip(image, 0, 255).astype(np.uint8)
        full = Image.fromarray(np.ascontiguousarray(picture))
        if full.size != (width, height):
            full = full.resize((width, height), Image.Resampling.BILINEAR)
        cx, _ = _grid(width, height)
        small = full.resize(cx.shape[::-1], Image.Resampling.BICUBIC)
        # An edge moves at most PUSH_IN / fps x half the frame a frame (at zoom 1): resampled
        # no further apart than PUSH_STEP_PX there, a blend between is as good as exact.
        edge = PUSH_IN / fps * max(width, height) / 2
        return _Backdrop(full, small, fps, max(1, int(PUSH_STEP_PX / edge)))

    def pushed_in(self, frame: int) -> Image.Image:
        """The picture pushed in as at frame `frame` of the video (a multiple of step)."""
        if frame not in self.pushed:
            if len(self.pushed) >= 2:
                del self.pushed[min(self.pushed)]
            box = _pushed_in(*self.full.size, _zoom(frame / self.fps))
            self.pushed[frame] = self.full.resize(self.full.size, Image.Resampling.BILINEAR,
                                                  box=box)  # fmt: skip
        return self.pushed[frame]


def _picture(look: SceneLook, width: int, height: int, t: float) -> np.ndarray:
    """One frame (uint8): drawn on a coarse grid, then smoothly upscaled (shapes are soft
    anyway)."""
    cx, cy = _grid(width, height)
    angle = look.angle + 0.15 * t
    ramp = np.clip(0.5 + (cx - 0.5) * np.cos(angle) + (cy - 0.5) * np.sin(angle), 0, 1)
    picture = look.colors[0] + ramp[..., None] * (look.colors[1] - look.colors[0])
    return _upscaled(_shapes(look, picture, cx, cy, width / height, t), width, height)


def _over_backdrop(look: SceneLook, backdrop: _Backdrop, frame: int) -> np.ndarray:
    """Frame `frame` of the video (uint8) over a picture: the picture pushed in by PUSH_IN a
    second about its centre (a blend of its exact resamples either side, `step` frames
    apart), the shapes drifting over it at half strength (the picture stays what the frame
    is of). Only the shapes are coarse: drawn over the picture's coarse copy (pushed in
    exactly), their difference is upscaled once, about mid-grey, and added in 8 bits."""
    width, height = backdrop.full.size
    t = frame / backdrop.fps
    key, into = divmod(frame, backdrop.step)
    pushed = backdrop.pushed_in(key * backdrop.step)
    if into:
        later = backdrop.pushed_in((key + 1) * backdrop.step)
        pushed = Image.blend(pushed, later, into / backdrop.step)
    cx, cy = _grid(width, height)
    grid = backdrop.small.size
    box = _pushed_in(*grid, _zoom(t))
    small = np.asarray(backdrop.small.resize(grid, Image.Resampling.BILINEAR, box=box),
                       np.float32)  # fmt: skip
    shaped = _shapes(look, small, cx, cy, width / height, t)
    change = np.clip(128.5 + 0.5 * (shaped - small), 0, 255).astype(np.uint8)
    change_full = Image.fromarray(change).resize((width, height), Image.Resampling.BILINEAR)
    return np.asarray(ImageChops.add(pushed, change_full, 1.0, -128))


def _zoom(t: float) -> float:
    """How far a picture is pushed in at time t (seconds into the video): PUSH_IN a second at
    first, easing towards 1 + PUSH_MAX (the time is the video's: the generator does not know
    where the scene began, and a linear push-in would fill the frame with a corner of a
    picture two minutes in)."""
    return 1.0 + PUSH_MAX * (1.0 - math.exp(-PUSH_IN * t / PUSH_MAX))


def _pushed_in(width: int, height: int, zoom: float) -> tuple[float, float, float, float]:
    """The box of a width x height picture that fills the frame pushed in by `zoom`."""
    w, h = width / zoom, height / zoom
    return (width - w) / 2, (height - h) / 2, (width + w) / 2, (height + h) / 2


def _shapes(look: SceneLook, picture: np.ndarray, cx: np.ndarray, cy: np.ndarray,
            aspect: float, t: float) -> np.ndarray:  # fmt: skip
    """The scene's soft shapes over `picture` (on the coarse grid) at time t."""
    for x, y, radius, vx, vy, phase, color in look.shapes:
        # Smooth closed paths (Lissajous), so nothing ever jumps from one edge to the other.
        px = x + 0.35 * np.sin(phase + 2.2 * vx * t) + 0.04 * np.sin(phase + 0.7 * t)
        py = y + 0.3 * np.sin(phase * 1.3 + 2.6 * vy * t) + 0.04 * np.cos(phase + 0.5 * t)
        d2 = ((cx - px) * aspect) ** 2 + (cy - py) ** 2
        blob = np.exp(-d2 / (2 * radius * radius))[..., None]
        picture = picture * (1 - blob) + np.minimum(look.colors[int(color)] * 1.1, 255) * blob
    return picture


def _upscaled(picture: np.ndarray, width: int, height: int) -> np.ndarray:
    small = Image.fromarray(np.clip(picture, 0, 255).astype(np.uint8))
    return np.asarray(small.resize((width, height), Image.Resampling.BILINEAR))


def _continue_from(
    frames: np.ndarray, context: np.ndarray, overlap: int, moves: np.ndarray | None = None
) -> int:
    """Reproduce the context over the overlap, then dissolve from its last frame (moved by
    `moves[j]` px at frame j, where a camera move goes on); gives the dissolve's length."""
    overlap = min(overlap, len(context), len(frames))
    frames[:overlap] = context[-overlap:] if overlap else frames[:overlap]
    last = context[-1]
    fade = max(1, (len(frames) - overlap) // 2)
    for j in range(overlap, min(len(frames), overlap + fade)):
        w = 1.0 - (j - overlap + 1) / (fade + 1)
        held = last if moves is None else _moved(last, int(moves[j][0]), int(moves[j][1]))
        frames[j] = w * held + (1 - w) * frames[j]
    return fade


def _moved(frame: np.ndarray, dx: int, dy: int, out: np.ndarray | None = None) -> np.ndarray:
    """The frame's content moved by (dx, dy) pixels, the edges it uncovers mirrored (as a
    reflecting pad would), written into `out` (a new float32 array if none): slices only."""
    height, width = frame.shape[:2]
    if out is None:
        out = np.empty(frame.shape, np.float32)
    for rows, from_rows in _shifted(height, dy):
        for cols, from_cols in _shifted(width, dx):
            out[rows, cols] = frame[from_rows, from_cols]
    return out


def _shifted(size: int, shift: int) -> list[tuple[slice, slice]]:
    """(to, from) slices along one axis of `size` that move its content by `shift`, the
    uncovered end mirrored about the edge pixel (shifts beyond the size stop at size - 1)."""
    s = max(-(size - 1), min(size - 1, shift))
    if s > 0:
        return [(slice(s, size), slice(0, size - s)), (slice(0, s), slice(s, 0, -1))]
    if s < 0:
        end = size - 2 + s  # the mirror of the last -s pixels before the edge one
        mirrored = slice(size - 2, end if end >= 0 else None, -1)
        return [(slice(0, size + s), slice(-s, size)), (slice(size + s, size), mirrored)]
    return [(slice(0, size), slice(0, size))]


def _palette(picture: np.ndarray) -> np.ndarray:
    """Three colours of a picture: the mean of its darkest, middle and brightest thirds (by
    luma, ties in pixel order: a stable sort's thirds, found from a histogram of luma)."""
    pixels = picture.reshape(-1, 3)
    if pixels.dtype != np.uint8:
        pixels = np.clip(pixels, 0, 255).astype(np.uint8)
    luma = sum(pixels[:, c] * np.int32(w) for c, w in enumerate((299, 587, 114)))  # x 1000
    below = np.cumsum(np.bincount(luma, minlength=255_001))  # pixels at or below each level
    third, extra = divmod(len(luma), 3)
    part = np.full(len(luma), 2, np.int8)  # 2 less how many of the two cuts it falls under
    for end in (third + (extra > 0), 2 * third + min(extra, 2)):  # as np.array_split cuts
        level = int(np.searchsorted(below, end))  # the level of the end-th darkest pixel
        darkest = luma < level
        tied = np.flatnonzero(luma == level)
        darkest[tied[: end - (int(below[level - 1]) if level else 0)]] = True
        part -= darkest
    counts = np.bincount(part, minlength=3)[:, None]
    sums = np.stack([np.bincount(part, pixels[:, c], 3) for c in range(3)], axis=1)
    return (sums / counts).astype(np.float32)


def _caption(frames: np.ndarray, text: str, segment: int, shown: np.ndarray) -> None:
    """The prompt written on each frame, as much as `shown` (0..1 per frame) says."""
    height, width = frames.shape[1:3]
    mask = _caption_mask(text, segment, width, height)
    if mask is None:
        return
    top, alpha = mask
    rows = slice(top, top + alpha.shape[0])
    region = frames[:, rows, :, :]
    weight = shown[:, None, None, None] * alpha[None, :, :, None] * 0.85
    region *= 1 - weight
    region += weight * 250


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
