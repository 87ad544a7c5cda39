"""Cuts judged as cuts (docs/qc.md, "Cuts"): no seam check across a cut (the shots are meant to
differ), but a check that it is clean: the frames on either side belong to one shot or the
other, none is a half-blend of the two (what a generator or an encode that smeared the cut
would leave). Pure numpy over the frames next to the cut."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from factory.qc.gate import Check
from factory.qc.seams import luma

BLEND_RATIO_LIMIT = 0.1  # a frame this close to the mean of its neighbours is a half-blend
MIN_CUT_MSE = 25.0  # luma MSE across the cut below which the shots look alike: nothing to judge
FRAMES_EACH_SIDE = 2


@dataclass(frozen=True)
class CutScore:
    """One cut: how far apart the shots are across it and how near the frames beside it come
    to a blend of their neighbours (1/4: a frame that is one shot's; 0: a 50/50 blend)."""

    cut: int  # the segment that starts the shot after the cut
    frame: int  # the shot's first frame in the video
    seconds: float
    jump: float  # luma MSE between the last frame before and the first after
    blend: float | None  # the smallest blend ratio beside the cut (None: the shots look alike)
    passed: bool
    failures: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cut": self.cut, "frame": self.frame, "seconds": round(self.seconds, 3),
            "jump": round(self.jump, 2),
            "blend": None if self.blend is None else round(self.blend, 4),
            "passed": self.passed, "failures": list(self.failures),
        }  # fmt: skip


def judge_cut(
    before: np.ndarray, after: np.ndarray, *, cut: int, frame: int, fps: float
) -> CutScore:
    """`before`: the last frames of the shot before (at least one), `after`: the first of the
    shot after. A frame next to the cut whose two neighbours straddle it is a half-blend when
    it sits nearer their mean than a quarter of their distance allows."""
    seq = [luma(f) for f in (*before[-FRAMES_EACH_SIDE:], *after[:FRAMES_EACH_SIDE])]
    split = min(len(before), FRAMES_EACH_SIDE)  # seq[split] is the shot's first frame
    jump = _mse(seq[split - 1], seq[split])
    ratios = []
    for i in (split - 1, split):  # the two frames whose neighbours straddle the cut
        if 0 < i < len(seq) - 1:
            straddle = _mse(seq[i - 1], seq[i + 1])
            if straddle >= MIN_CUT_MSE:
                ratios.append(_mse(seq[i], (seq[i - 1] + seq[i + 1]) / 2) / straddle)
    blend = min(ratios) if ratios and jump >= MIN_CUT_MSE else None
    failures = []
    if blend is not None and blend < BLEND_RATIO_LIMIT:
        failures.append(
            f"a frame beside the cut is a blend of the two shots (ratio {blend:.3f} < "
            f"{BLEND_RATIO_LIMIT}): the cut is smeared"
        )
    return CutScore(cut, frame, frame / fps, jump, blend, not failures, failures)


def cut_checks(cuts: list[dict[str, Any]]) -> list[Check]:
    return [
        Check(
            f"cut_{c['cut']}_clean",
            bool(c["passed"]),
            c["blend"],
            f">= {BLEND_RATIO_LIMIT}",
            f"cut at {c['seconds']:.2f} s (segment {c['cut']}): {'; '.join(c['failures'])}",
        )
        for c in cuts
    ]


def _mse(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean((a - b) ** 2))


def judge_transition(
    per_frame: dict[str, list[float]],
    *,
    cut: int,
    name: str,
    frame: int,
    frames: int,
    fps: float,
    min_psnr: float,
) -> dict[str, Any]:
    """A transition judged as a transition: its delivered frames against the blend of the
    two shots' lossless frames (the reference the chunk was measured against), by the
    per-frame PSNR-Y of the first rendition over the transition's frames."""
    values = [
        psnr
        for number, psnr in zip(
            per_frame.get("frame", []), per_frame.get("psnr_y", []), strict=False
        )
        if frame <= number < frame + frames
    ]
    mean = sum(values) / len(values) if values else None
    passed = mean is None or mean >= min_psnr
    failures = [] if passed else [
        f"its frames are {mean:.1f} dB from the blend of the two shots (at least {min_psnr:g})"
    ]  # fmt: skip
    return {
        "cut": cut, "transition": name, "frame": frame, "seconds": round(frame / fps, 3),
        "frames": frames, "psnr_y": None if mean is None else round(mean, 2),
        "sampled": len(values), "passed": passed, "failures": failures,
    }  # fmt: skip


def transition_checks(transitions: list[dict[str, Any]], min_psnr: float) -> list[Check]:
    return [
        Check(
            f"transition_{t['cut']}_blend",
            bool(t["passed"]),
            t["psnr_y"],
            f">= {min_psnr:g} dB",
            f"{t['transition']} at {t['seconds']:.2f} s (segment {t['cut']}): "
            + "; ".join(t["failures"]),
        )
        for t in transitions
    ]
