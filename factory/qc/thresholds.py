"""The quality gate's limits, from FACTORY_QC_* settings (docs/qc.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

SCENE_CHANGE_JUMP_FACTOR = 3.0  # a seam at a new scene may jump this much harder


@dataclass(frozen=True)
class QcThresholds:
    seam_jump: float = 4.0  # frame difference across a seam / median within its neighbours
    seam_delta_e: float = 8.0  # Lab colour shift (CIE76) of the mean across a seam
    seam_delta_l: float = 6.0  # luminance (L*) shift of the mean across a seam
    seam_ssim_drop: float = 0.3  # SSIM across the seam below the neighbours' median SSIM
    drift_delta_e: float = 30.0  # colour drift from a scene's first segment to its last
    drift_delta_l: float = 20.0  # brightness (L*) drift within a scene (real shots: up to 15)
    drift_contrast: float = 2.0  # luma spread may grow or shrink by this factor (real: 1.65)
    regenerations: int = 2  # new-seed attempts for a segment after a bad seam
    black_seconds: float = 0.5  # a black run at least this long fails
    freeze_seconds: float = 2.0  # a frozen run at least this long fails
    min_psnr: float = 38.0  # PSNR-Y (dB), libvmaf's per-frame psnr_y, mean over frames
    min_ssim: float = 0.95  # SSIM (libvmaf float_ssim, luma), mean over frames
    min_vmaf: float = 82.0  # VMAF v0.6.1, mean over frames
    vmaf_subsample: int = 4  # fidelity on every Nth frame (1: all; docs/benchmarks.md: cost)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def seam_limits(self, scene_change: bool) -> dict[str, float]:
        """The limit of each measure a seam is judged by. A new scene may change colour and
        move harder on purpose (the model morphs into the new prompt): there the colour is not
        judged and only a jump like a hard cut fails."""
        jump = self.seam_jump * (SCENE_CHANGE_JUMP_FACTOR if scene_change else 1)
        limits = {"jump": jump, "ssim_drop": self.seam_ssim_drop}
        if not scene_change:
            limits |= {"delta_e": self.seam_delta_e, "delta_l": self.seam_delta_l}
        return limits

    def seam_score(self, seam: dict[str, Any]) -> float:
        """How far a recorded seam went toward failing: its largest measure over that
        measure's limit (1.0: at the limit)."""
        limits = self.seam_limits(bool(seam.get("scene_change")))
        return max(float(seam.get(name) or 0) / max(limit, 1e-9) for name, limit in limits.items())


ENV_NAMES = {
    "seam_jump": "FACTORY_QC_SEAM_JUMP",
    "seam_delta_e": "FACTORY_QC_SEAM_DELTA_E",
    "seam_delta_l": "FACTORY_QC_SEAM_DELTA_L",
    "seam_ssim_drop": "FACTORY_QC_SEAM_SSIM_DROP",
    "drift_delta_e": "FACTORY_QC_DRIFT_DELTA_E",
    "drift_delta_l": "FACTORY_QC_DRIFT_DELTA_L",
    "drift_contrast": "FACTORY_QC_DRIFT_CONTRAST",
    "regenerations": "FACTORY_QC_REGENERATIONS",
    "black_seconds": "FACTORY_QC_BLACK_SECONDS",
    "freeze_seconds": "FACTORY_QC_FREEZE_SECONDS",
    "min_psnr": "FACTORY_QC_MIN_PSNR",
    "min_ssim": "FACTORY_QC_MIN_SSIM",
    "min_vmaf": "FACTORY_QC_MIN_VMAF",
    "vmaf_subsample": "FACTORY_QC_VMAF_SUBSAMPLE",
}
