"""Quality-gate benchmark: QC time of a 720p video as a ratio to the encode time of the same
video, both measured in this run (target <= 0.3).

    python bench/qc.py              # 30 s of 1280x720 at 24 fps, three renditions
    python bench/qc.py --quick      # 10 s

The video is made by the factory itself (procedural generator, segments of 48 frames), then
encoded by the encode stage (master x265 10-bit, mobile x265, compat x264) and muxed; the qc
gate runs on it as in a job, in its two halves, each timed: the per-chunk measurement
(done while generation runs in a job: one ffmpeg pass per chunk decoding every rendition and
the lossless reference once, black/frozen detection, PSNR-Y/SSIM/VMAF per rendition with
libvmaf, packet digests, seam thumbnails), then the qc stage (joining the measurements,
probes, packet matching, seams and drift, the report, contact sheet and plot). It runs at
each VMAF subsample (FACTORY_QC_VMAF_SUBSAMPLE) so the cost of measuring every frame is
visible. The figure is the whole QC work (both halves) / the encode.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from factory.config import Settings  # noqa: E402
from factory.manifest import parse_manifest  # noqa: E402
from factory.ops.submit import submit  # noqa: E402
from factory.pipeline.chunk_qc import measure_chunk  # noqa: E402
from factory.pipeline.context import StageContext  # noqa: E402
from factory.pipeline.encode import run_encode  # noqa: E402
from factory.pipeline.files import Segments  # noqa: E402
from factory.pipeline.generate import run_generate  # noqa: E402
from factory.pipeline.mux import run_mux  # noqa: E402
from factory.pipeline.qc import run_qc  # noqa: E402
from factory.plan.chunks import plan_chunks  # noqa: E402
from factory.stages import Stage  # noqa: E402
from factory.wiring import Factory  # noqa: E402

WIDTH, HEIGHT, FPS = 1280, 720, 24


def manifest(duration: float) -> str:
    return (
        f"batch: qcbench\nvideos:\n  - id: v\n    duration: {duration}\n    fps: {FPS}\n"
        f"    resolution: {WIDTH}x{HEIGHT}\n    segment: {{frames: 48, overlap: 8}}\n"
        "    scenes:\n      - {start: 0, prompt: 'A harbor at dawn, fog on the water'}\n"
        f"      - {{start: {duration / 2}, prompt: 'Boats leave the harbor, gulls overhead'}}\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 s instead of 30 s")
    parser.add_argument("--subsamples", default="1,2,4", help="VMAF subsamples to time")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    duration = 10.0 if args.quick else 30.0
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        settings = Settings.from_env({"FACTORY_HOME": str(home)})
        factory = Factory.open(settings)
        ctx = StageContext.from_settings(settings, factory.jobs, factory.database)
        job = submit(parse_manifest(manifest(duration)), factory.jobs, None).jobs[0]
        job = factory.jobs.claim(job.job_id, seen_attempt=job.attempt, worker="bench")
        print(f"generating {duration:.0f} s of {WIDTH}x{HEIGHT} @ {FPS} fps...", flush=True)
        job = run_generate(ctx, job)
        print("encoding master, mobile, compat...", flush=True)
        started = time.perf_counter()
        job = run_encode(ctx, job)
        encode_seconds = time.perf_counter() - started
        job = run_mux(ctx, job)
        assert job.stage is Stage.QC
        results = {
            "machine": {"cpus": os.cpu_count()},
            "video": f"{WIDTH}x{HEIGHT} @ {FPS} fps",
            "seconds": duration,
            "encode_seconds": round(encode_seconds, 2),
            "qc": {},
        }
        for subsample in (int(s) for s in args.subsamples.split(",")):
            ctx.qc = replace(ctx.qc, vmaf_subsample=subsample)
            print(f"qc, VMAF on every {subsample}. frame...", flush=True)
            current = factory.jobs.get(job.job_id)
            made = Segments.load(factory.jobs, current)
            started = time.perf_counter()
            for chunk in plan_chunks(current.video):
                measure_chunk(ctx, made, chunk)
            measure_seconds = time.perf_counter() - started
            checked = run_qc(ctx, current)
            qc_seconds = time.perf_counter() - started
            assert checked.progress["qc"]["passed"], checked.progress["qc"]
            results["qc"][subsample] = {
                "seconds": round(qc_seconds, 2),
                "per_chunk_seconds": round(measure_seconds, 2),
                "stage_seconds": round(qc_seconds - measure_seconds, 2),
                "ratio": round(qc_seconds / encode_seconds, 3),
                "qc_seconds_per_minute": round(qc_seconds * 60 / duration, 1),
                "fidelity": checked.progress["qc"]["fidelity"],
            }
            # Back to qc for the next subsample (the stage moved the job on to deliver).
            job = factory.jobs.requeue(job.job_id, from_stage=Stage.QC)
            job = factory.jobs.claim(job.job_id, seen_attempt=job.attempt, worker="bench")
    print("\n| VMAF subsample | QC s (per chunk + qc stage) | encode s | QC / encode | target |")
    print("|---|---|---|---|---|")
    for subsample, r in results["qc"].items():
        print(
            f"| {subsample} | {r['seconds']:.1f} ({r['per_chunk_seconds']:.1f} + "
            f"{r['stage_seconds']:.1f}) | {encode_seconds:.1f} | {r['ratio']:.3f} | <= 0.3 |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
