"""The generate stage's own CPU work per segment, at the nightly example's shape (48 frames at
640x360, 8 of overlap), each figure a ratio to a baseline measured in the same run
(docs/benchmarks.md, "Segment path"):

    python bench/segment_path.py [--runs 5] [--json FILE]

1. stitching a segment onto the one before (alignment and cross-fade): the table lookup the
   factory uses for 8-bit frames / the float32 definition it reproduces bit for bit
   (target <= 0.5: the overlap's 8 frames and the colour statistics stay in float32 as defined);
2. the picture every qc stage draws (quality.png of a 2-minute video: three renditions, 49
   seams, a loudness panel) / the contact sheet of the same 49 seams (target <= 0.5);
3. a whole segment's Python work in the stage (procedural generation, stitching, seam
   scoring, the lossless write) / its generation alone, in seconds and as a ratio (reported,
   no target: it says where the rest of a segment's time goes).

Each figure is the least of `--runs` runs (CPU time of this process: the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import least as least_of  # noqa: E402
from factory.generate.base import SegmentSpec  # noqa: E402
from factory.generate.procedural import ProceduralGenerator  # noqa: E402
from factory.media import stitch as stitching  # noqa: E402
from factory.media.intermediate import write_segment  # noqa: E402
from factory.plan.segments import SegmentPlan  # noqa: E402
from factory.qc import pictures  # noqa: E402
from factory.qc.seams import score_seam  # noqa: E402

WIDTH, HEIGHT, FRAMES, OVERLAP, FPS = 640, 360, 48, 8, 16


def least(runs: int, work: Callable[[], object]) -> float:
    return least_of(runs, work, clock=time.process_time)  # CPU time: the machine is shared


def segment(generator: ProceduralGenerator, index: int, context: np.ndarray | None) -> np.ndarray:
    spec = SegmentSpec(index=index, first_frame=index * (FRAMES - OVERLAP), frames=FRAMES,
                       context=OVERLAP if context is not None else 0, width=WIDTH,
                       height=HEIGHT, fps=FPS)  # fmt: skip
    prompt = generator.encode_prompt("a harbor at dawn, boats moored, fog over the water")
    return generator.generate(spec, prompt, context, seed=7 + index)


def stitching_figures(runs: int) -> dict[str, float]:
    generator = ProceduralGenerator()
    first = segment(generator, 0, None)
    second = segment(generator, 1, first[-OVERLAP:])
    plan = SegmentPlan(index=1, first_frame=FRAMES - OVERLAP, frames=FRAMES, context=OVERLAP,
                       write_start=FRAMES - OVERLAP, write_end=2 * (FRAMES - OVERLAP),
                       scene=0, is_last=False)  # fmt: skip
    table = least(runs, lambda: stitching.stitch(plan, second, first, 1.0))
    floats = least(runs, lambda: stitching.stitch(plan, second.astype(np.float32), first, 1.0))
    stitched = stitching.stitch(plan, second, first, 1.0)
    defined = stitching.stitch(plan, second.astype(np.float32), first, 1.0)
    assert np.array_equal(stitched.frames, defined.frames), "the table path left the definition"
    seam = least(runs, lambda: score_seam(first[-8:], stitched.frames, OVERLAP, seam=1,
                                          frame=FRAMES - OVERLAP, fps=FPS))  # fmt: skip
    made = least(runs, lambda: segment(generator, 1, first[-OVERLAP:]))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "segment.mkv"
        write = least(runs, lambda: write_segment(path, stitched.frames, FPS))
    return {"stitch_table_s": table, "stitch_float_s": floats, "seam_score_s": seam,
            "generate_s": made, "lossless_write_s": write}  # fmt: skip


def picture_figures(runs: int) -> dict[str, float]:
    rng = np.random.default_rng(1)
    frames = 120 * FPS
    renditions = {name: {"vmaf": list(90 + 5 * rng.random(frames)),
                         "psnr_y": list(40 + 5 * rng.random(frames)),
                         "ssim": list(0.95 + 0.04 * rng.random(frames)),
                         "frame": list(range(frames))}
                  for name in ("master", "mobile", "compat")}  # fmt: skip
    seams = [{"seam": i, "frame": i * 40, "seconds": i * 2.5, "jump": 1 + rng.random(),
              "delta_e": 1.0, "delta_l": 0.5, "ssim": 0.9, "ssim_drop": 0.01, "passed": True,
              "scene_change": i % 12 == 0} for i in range(1, 50)]  # fmt: skip
    loudness = {name: {"short_term": [[t / 2, -20 - rng.random()] for t in range(240)],
                       "integrated": -23.0, "range": 3.0, "true_peak": -2.0, "target": -23}
                for name in renditions}  # fmt: skip
    limits = {"min_vmaf": 70, "min_psnr": 30, "min_ssim": 0.9, "seam_jump": 4}
    thumb = rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)
    rows = [pictures.SeamPicture(s, thumb, thumb) for s in seams]
    plot = least(runs, lambda: pictures.quality_plot("bench", FPS, renditions, seams, limits,
                                                     None, loudness))  # fmt: skip
    sheet = least(runs, lambda: pictures.contact_sheet("bench", rows))
    return {"quality_plot_s": plot, "contact_sheet_s": sheet}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    figures = {**stitching_figures(args.runs), **picture_figures(args.runs)}
    whole = sum(figures[k] for k in ("generate_s", "stitch_table_s", "seam_score_s",
                                     "lossless_write_s"))  # fmt: skip
    rows = [
        ("stitch, table / float32 definition",
         figures["stitch_table_s"] / figures["stitch_float_s"],
         f"{figures['stitch_table_s']:.3f} s / {figures['stitch_float_s']:.3f} s", "<= 0.5"),
        ("quality.png / contact.png, 2-minute video",
         figures["quality_plot_s"] / figures["contact_sheet_s"],
         f"{figures['quality_plot_s']:.3f} s / {figures['contact_sheet_s']:.3f} s", "<= 0.5"),
        ("segment's Python work / its generation", whole / figures["generate_s"],
         f"{whole:.3f} s / {figures['generate_s']:.3f} s (seam scoring "
         f"{figures['seam_score_s']:.3f} s, lossless write {figures['lossless_write_s']:.3f} s)",
         "reported"),
    ]  # fmt: skip
    print("| figure | ratio | seconds (CPU, least of runs) | target |")
    print("|---|---|---|---|")
    for name, ratio, detail, target in rows:
        print(f"| {name} | {ratio:.3f} | {detail} | {target} |")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
