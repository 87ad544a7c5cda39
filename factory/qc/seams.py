"""Seam and drift scores, from frames (pure numpy; no I/O).

A seam is where one segment's written frames end and the next one's begin. The next
segment's first `overlap` written frames cross-fade from the previous tail, so a seam is a
*transition*: the last frame before it, the cross-faded frames, and the first frame after.
For each seam:

- jump: the largest mean absolute frame difference across the transition, divided by the
  median frame difference within the neighbouring windows (how much harder the picture
  moves at the seam than around it; 1 is normal);
- colour and luminance shift: CIE76 ΔE and ΔL* between the mean Lab colour of the two
  frames before the seam and the two after the transition, less the median change over the
  same distance inside the windows (what the picture changes anyway, e.g. in a pan);
- SSIM (luma) between the last frame before and the first frame after the transition,
  and its drop below the median SSIM of equally distant frame pairs inside the windows
  (noise-like or fast content scores low everywhere, so the drop is what is judged).

Drift: ΔE between the mean Lab colour of a scene's first and last segment.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from factory.qc.thresholds import QcThresholds

WINDOW = 8  # frames either side of a seam that are compared
MIN_MOTION = 0.5  # 8-bit levels: the floor of the "normal" frame difference (static shots)
COLOUR_FRAMES = 2  # frames averaged either side of a seam for its colour shift


def mean_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float32) - b.astype(np.float32)).mean())


def srgb_to_lab(rgb: np.ndarray) -> np.ndarray:
    """[..., 3] uint8 or float 0..255 sRGB to CIE Lab (D65)."""
    c = np.asarray(rgb, np.float64) / 255.0
    linear = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    matrix = np.array(
        [[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]
    )
    xyz = linear @ matrix.T / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > 216 / 24389, np.cbrt(xyz), (24389 / 27 * xyz + 16) / 116)
    return np.stack(
        [116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]), 200 * (f[..., 1] - f[..., 2])],
        axis=-1,
    )


def mean_lab(frames: np.ndarray) -> np.ndarray:
    """Mean Lab of frames (the mean RGB converted: cheap, and what a viewer sees as the cast)."""
    return srgb_to_lab(mean_rgb(frames))


def mean_rgb(frames: np.ndarray) -> np.ndarray:
    """Mean of each channel, in float64, without a float copy of the frames (channel by
    channel: five times faster than a mean over the interleaved pixels at 832x480)."""
    return np.array([frames[..., c].mean(dtype=np.float64) for c in range(3)])


def colour_record(frames: np.ndarray) -> dict[str, Any]:
    """What a segment's colour looks like, kept per segment for the drift and flatness checks:
    its mean Lab colour and its luma spread (standard deviation, 8-bit levels)."""
    lab = mean_lab(frames)
    step = max(1, len(frames) // 8)  # a sample of frames is enough for the spread
    spread = float(np.std(luma(frames[::step])))
    return {"lab": [round(float(v), 3) for v in lab], "spread": round(spread, 3)}


def luma(frame: np.ndarray) -> np.ndarray:
    """Rec. 601 luma in float64 (of one frame or a stack)."""
    if frame.dtype == np.uint8:  # the same float64 values, without a float copy of the frame
        return 0.299 * frame[..., 0] + 0.587 * frame[..., 1] + 0.114 * frame[..., 2]
    f = frame.astype(np.float64)
    return 0.299 * f[..., 0] + 0.587 * f[..., 1] + 0.114 * f[..., 2]


def ssim(a: np.ndarray, b: np.ndarray, size: int = 8) -> float:
    """Mean SSIM of two frames' luma over 8x8 windows (Wang et al., box window)."""
    return ssim_of_luma(luma(a), luma(b), size)


def ssim_of_luma(x: np.ndarray, y: np.ndarray, size: int = 8) -> float:
    return float(_ssim_stack(x[None], y[None], size)[0])


@dataclass
class SeamScore:
    seam: int  # index of the segment that starts here
    frame: int  # output frame of the first frame after the seam
    seconds: float
    jump: float
    delta_e: float
    delta_l: float
    ssim: float
    ssim_drop: float
    scene_change: bool  # the segment after the seam starts a new scene (colour may change)
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}


def score_seam(
    before: np.ndarray,
    after: np.ndarray,
    transition: int,
    *,
    seam: int,
    frame: int,
    fps: float,
    scene_change: bool = False,
    limits: QcThresholds | None = None,
) -> SeamScore:
    """`before`: the last frames written before the seam; `after`: the frames from the seam on,
    the first `transition` of them cross-faded. Windows of at least 2 frames each."""
    limits = limits or QcThresholds()
    if len(before) < 1 or len(after) < transition + 1:
        raise ValueError("a seam needs a frame before it and one after its transition")
    across = [before[-1], *after[: transition + 1]]
    jumps = [mean_abs_diff(p, q) for p, q in itertools.pairwise(across)]
    settled = after[transition + 1 :] if len(after) > transition + 1 else after[-1:]
    within = [mean_abs_diff(p, q) for p, q in itertools.pairwise(before)]
    within += [mean_abs_diff(p, q) for p, q in itertools.pairwise(settled)]
    normal = max(float(np.median(within)) if within else MIN_MOTION, MIN_MOTION)
    jump = max(jumps) / normal
    delta_e, delta_l = _colour_shift(before, after, settled, transition)
    distance = transition + 1
    seam_ssim = ssim(before[-1], after[transition])
    # SSIM of the frame pairs `distance` apart inside each window: its normal
    pairs = np.concatenate([_ssims_apart(luma(w), distance) for w in (before, settled)])
    normal_ssim = float(np.median(pairs)) if len(pairs) else seam_ssim
    score = SeamScore(
        seam,
        frame,
        round(frame / fps, 3),
        round(jump, 3),
        round(delta_e, 3),
        round(delta_l, 3),
        round(seam_ssim, 4),
        round(max(0.0, normal_ssim - seam_ssim), 4),
        scene_change,
    )
    _judge(score, limits)
    return score


def _colour_shift(
    before: np.ndarray, after: np.ndarray, settled: np.ndarray, transition: int
) -> tuple[float, float]:
    """The seam's ΔE and ΔL, less what the picture changes anyway inside the windows."""
    # Colour: the two frames either side of the transition, less the change the picture makes
    # anyway over the same distance inside the windows (a camera pan changes colour too).
    delta = mean_lab(after[transition : transition + COLOUR_FRAMES]) - mean_lab(
        before[-COLOUR_FRAMES:]
    )
    natural = _natural_lab_change(before, settled, transition + COLOUR_FRAMES)
    delta_e = max(0.0, float(np.sqrt((delta**2).sum())) - natural[0])
    delta_l = max(0.0, float(abs(delta[0])) - natural[1])
    return delta_e, delta_l


def _judge(score: SeamScore, limits: QcThresholds) -> None:
    """Add to the score's failures each limit it passes (the colour ones not at a new scene)."""
    limit = limits.seam_limits(score.scene_change)
    if score.jump > limit["jump"]:
        score.failures.append(f"jump {score.jump:.2f} > {limit['jump']:g}")
    if "delta_e" in limit and score.delta_e > limit["delta_e"]:
        score.failures.append(f"colour shift ΔE {score.delta_e:.1f} > {limits.seam_delta_e}")
    if "delta_l" in limit and score.delta_l > limit["delta_l"]:
        score.failures.append(f"luminance shift ΔL {score.delta_l:.1f} > {limits.seam_delta_l}")
    if score.ssim_drop > limit["ssim_drop"]:
        score.failures.append(f"SSIM drop {score.ssim_drop:.2f} > {limits.seam_ssim_drop}")


def _ssims_apart(stack: np.ndarray, distance: int, size: int = 8) -> np.ndarray:
    """ssim_of_luma of every pair of planes `distance` apart in a stack [N, H, W]: each
    plane's window means and mean squares are computed once, not once per pair it is in."""
    pairs = len(stack) - distance
    if pairs <= 0:
        return np.empty(0)
    size = min(size, *stack.shape[1:])
    means = [_boxes(stack[i : i + 1], size)[0] for i in range(len(stack))]
    squares = [_boxes(stack[i : i + 1] * stack[i : i + 1], size)[0] for i in range(len(stack))]
    values = np.empty(pairs)
    for i in range(pairs):
        j = i + distance
        mx, my = means[i], means[j]
        vx = squares[i] - mx * mx
        vy = squares[j] - my * my
        cov = _boxes(stack[i : i + 1] * stack[j : j + 1], size)[0] - mx * my
        values[i] = _ssim_map(mx, my, vx, vy, cov).mean()
    return values


def _ssim_stack(x: np.ndarray, y: np.ndarray, size: int = 8) -> np.ndarray:
    size = min(size, *x.shape[1:])
    mx, my = _boxes(x, size), _boxes(y, size)
    vx = _boxes(x * x, size) - mx * mx
    vy = _boxes(y * y, size) - my * my
    cov = _boxes(x * y, size) - mx * my
    value = _ssim_map(mx, my, vx, vy, cov)
    return value.reshape(len(value), -1).mean(axis=1)


def _ssim_map(mx: np.ndarray, my: np.ndarray, vx: np.ndarray, vy: np.ndarray,
              cov: np.ndarray) -> np.ndarray:  # fmt: skip
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    return ((2 * mx * my + c1) * (2 * cov + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))


def _boxes(images: np.ndarray, size: int) -> np.ndarray:
    """Mean over every size x size window (valid positions, via an integral image), for
    each image of a stack [N, H, W]."""
    count, height, width = images.shape
    s = np.zeros((count, height + 1, width + 1))  # the integral image, a row and column of 0
    np.cumsum(images, axis=1, out=s[:, 1:, 1:])
    np.cumsum(s[:, 1:, 1:], axis=2, out=s[:, 1:, 1:])
    return (
        s[:, size:, size:] - s[:, :-size, size:] - s[:, size:, :-size] + s[:, :-size, :-size]
    ) / (size * size)


def _natural_lab_change(
    before: np.ndarray, after: np.ndarray, distance: int
) -> tuple[float, float]:
    """Median ΔE and ΔL between mean colours of frame pairs `distance` apart inside the windows."""
    changes = []
    for frames in (before, after):
        labs = [srgb_to_lab(mean_rgb(f)) for f in frames]
        for a, b in zip(labs, labs[distance:], strict=False):
            changes.append((float(np.sqrt(((b - a) ** 2).sum())), float(abs(b[0] - a[0]))))
    if not changes:
        return 0.0, 0.0
    return float(np.median([c[0] for c in changes])), float(np.median([c[1] for c in changes]))


def drift_delta_e(first: np.ndarray, last: np.ndarray) -> float:
    """ΔE between the mean colours of two segments (or two Lab means given directly)."""
    a = first if first.shape == (3,) else mean_lab(first)
    b = last if last.shape == (3,) else mean_lab(last)
    return float(np.sqrt(((a - b) ** 2).sum()))


def scene_drift(
    scene_of_segment: list[int], colours: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """Per scene with two or more whole segments: ΔE of the mean colour from its first segment
    to its last (a new scene may look different on purpose, so drift is judged within scenes;
    the segment that morphs into a new scene does not count as that scene's first)."""
    by_scene: dict[int, list[int]] = {}
    for segment, scene in enumerate(scene_of_segment):
        if str(segment) in colours:
            by_scene.setdefault(scene, []).append(segment)
    drift = []
    for scene, found in sorted(by_scene.items()):
        # A later scene's first segment morphs out of the scene before: it starts the scene's
        # colours, not the first segment of it that is all this scene.
        segments = found[1:] if scene > 0 and found[0] > 0 else found
        if len(segments) < 2:
            continue
        start, end = colours[str(segments[0])], colours[str(segments[-1])]
        first, last = np.asarray(start["lab"]), np.asarray(end["lab"])
        contrast = end["spread"] / max(start["spread"], 1e-3)
        drift.append(
            {
                "scene": scene,
                "first_segment": segments[0],
                "last_segment": segments[-1],
                "delta_e": round(drift_delta_e(first, last), 3),
                "delta_l": round(float(abs(last[0] - first[0])), 3),
                "contrast": round(float(contrast), 3),
            }
        )
    return drift
