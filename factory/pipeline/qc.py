"""The qc stage: every muxed rendition decoded and compared frame by frame with the lossless
segment intermediates (PSNR-Y, SSIM, VMAF), checked for black and frozen runs and for the
stream rules; the seams scored at generation and the colour drift within each scene
judged; the report, the contact sheet and the quality plot stored beside the outputs. A
job that fails stops here, before delivery, with the reasons."""

from __future__ import annotations

import json
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from factory import metrics
from factory.db.state import Job
from factory.errors import QualityGateFailed
from factory.generate.guard import FLAT_SPREAD
from factory.media.analyze import Reference, analyze
from factory.media.frames import frames_at
from factory.media.probe import probe
from factory.pipeline import files
from factory.pipeline.context import StageContext
from factory.pipeline.generate import video_plan
from factory.plan import SegmentPlan
from factory.qc import gate, pictures, report
from factory.qc.basic import expected_checks, probe_summary
from factory.qc.seams import scene_drift
from factory.stages import Stage
from factory.store import keys


def run_qc(ctx: StageContext, job: Job) -> Job:
    video = job.video
    plans = video_plan(video)
    limits = ctx.qc
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=ctx.work_dir(video))))
        segments = [stack.enter_context(ctx.store.local_path(files.segment(job, p.index)))
                    for p in plans]  # fmt: skip
        reference = Reference(
            [(path, p.write_count) for path, p in zip(segments, plans, strict=True)],
            video.width,
            video.height,
        )
        renditions: dict[str, dict[str, Any]] = {}
        series: dict[str, dict[str, list[float]]] = {}
        defects: dict[str, list[list[float]]] = {"black": [], "frozen": []}
        muxed = {
            r: stack.enter_context(ctx.store.local_path(files.muxed(job, r)))
            for r in video.renditions
        }
        measured_all = analyze(
            muxed,
            video.fps,
            video.frames_total / video.fps,
            reference=reference,
            work=work / "analysis",
            subsample=limits.vmaf_subsample,
        )
        for rendition in video.renditions:
            facts = probe(muxed[rendition])
            measured = measured_all[rendition]
            fidelity = (
                gate.fidelity(measured, limits.vmaf_subsample) if measured.decoded_ok else None
            )
            checks = [
                *gate.decode_checks(measured, video.frames_total),
                *expected_checks(video, rendition, facts),
                *(
                    gate.content_checks(measured, limits)
                    if rendition == video.renditions[0]
                    else []
                ),
                *(gate.fidelity_checks(fidelity, limits) if fidelity else []),
            ]
            content = {"black": _runs(measured.black), "frozen": _runs(measured.frozen)}
            renditions[rendition] = {
                "checks": checks,
                "fidelity": fidelity,
                "content": content,
                "probe": probe_summary(facts),
            }
            series[rendition] = measured.per_frame
            for kind, limit in (("black", limits.black_seconds), ("frozen", limits.freeze_seconds)):
                defects[kind] += [r for r in content[kind] if r[1] - r[0] >= limit]
        seams = [
            job.progress.get("seams", {})[str(p.index)]
            for p in plans[1:]
            if str(p.index) in job.progress.get("seams", {})
        ]
        colours = job.progress.get("colour", {})
        drift = scene_drift([p.scene for p in plans], colours)
        segment_checks = [
            gate.Check(
                f"segment_{index}_spread",
                rec["spread"] >= FLAT_SPREAD,
                rec["spread"],
                FLAT_SPREAD,
                f"segment {index} is one flat colour",
            )
            for index, rec in sorted(colours.items(), key=lambda kv: int(kv[0]))
        ]
        images = {"contact": "contact.png", "quality": "quality.png"}
        document = report.build(
            {"job_id": job.job_id},
            renditions,
            seams=seams,
            seam_checks=gate.seam_checks(seams),
            drift=drift,
            drift_checks=gate.drift_checks(drift, limits),
            segment_checks=segment_checks,
            limits=limits,
            images=images,
        )
        title = f"{job.job_id}: {'passed' if document['passed'] else 'FAILED'}"
        sheet = pictures.contact_sheet(title, _seam_pictures(ctx, job, plans, segments, seams))
        plot = pictures.quality_plot(title, video.fps, series, seams, limits.to_dict(), defects)
    # Under this attempt's folder: the report and pictures of an earlier run are never
    # mistaken for this one's, and a stale holder's land beside them.
    made = {name: keys.work(video.batch, video.video_id, f"{name}.png", job.attempt)
            for name in images}  # fmt: skip
    ctx.store.put_bytes(made["contact"], sheet)
    ctx.store.put_bytes(made["quality"], plot)
    report_key = keys.work(video.batch, video.video_id, "qc.json", job.attempt)
    ctx.store.put_bytes(report_key, json.dumps(document, indent=2).encode())
    summary = {**report.summary(document), "report": report_key, "pictures": made}
    job = ctx.machine.checkpoint(
        job.job_id,
        attempt=job.attempt,
        updates={"qc": summary},
        event="qc.done",
        detail={"passed": document["passed"], "failures": summary["failures"]},
    )
    if not document["passed"]:
        metrics.qc_failed([failure["check"] for failure in document["failures"]])
        raise QualityGateFailed(summary["failures"])
    return ctx.machine.transition(job.job_id, attempt=job.attempt, to=Stage.DELIVER)


def _seam_pictures(
    ctx: StageContext,
    job: Job,
    plans: list[SegmentPlan],
    segments: list[Path],
    seams: list[dict[str, Any]],
) -> list[pictures.SeamPicture]:
    """The last frame written before each seam and the first after its transition: from the
    thumbnails kept with each segment, else read from the lossless segment files."""
    by_index = {s["seam"]: s for s in seams}
    out = []
    for plan in plans[1:]:
        seam = by_index.get(plan.index)
        if seam is None:
            continue
        before = _thumb(ctx, job, plan.index - 1, "last")
        after = _thumb(ctx, job, plan.index, "first")
        if before is None or after is None:
            previous = plans[plan.index - 1]
            found_before = frames_at(segments[plan.index - 1], [previous.write_count - 1])
            found_after = frames_at(segments[plan.index], [min(plan.context, plan.write_count - 1)])
            before = next(iter(found_before.values()), None)
            after = next(iter(found_after.values()), None)
        if before is not None and after is not None:
            out.append(pictures.SeamPicture(seam, before, after))
    return out


def _thumb(ctx: StageContext, job: Job, index: int, name: str) -> np.ndarray | None:
    key = files.thumbs(job, index)
    if not ctx.store.exists(key):
        return None
    with ctx.store.local_path(key) as path:
        return pictures.read_thumbnails(path.read_bytes()).get(name)


def _runs(runs: list[tuple[float, float]]) -> list[list[float]]:
    return [[round(s, 3), round(e, 3)] for s, e in runs]
