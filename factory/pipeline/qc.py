"""The qc stage: every rendition compared frame by frame with the lossless segment
intermediates (PSNR-Y, SSIM, VMAF) and checked for black and frozen runs, from the
measurements made chunk by chunk while generation ran (factory/pipeline/chunk_qc.py); the
delivered files probed for the stream rules and their packets matched to the measured
chunks; the seams scored at generation and the colour drift within each scene judged; the
report, the contact sheet and the quality plot stored beside the outputs. A job that fails
stops here, before delivery, with the reasons."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import numpy as np

from factory.errors import QualityGateFailed
from factory.generate.guard import FLAT_SPREAD
from factory.infra import metrics
from factory.job import Job
from factory.media.analyze import PassResult
from factory.media.frames import frames_at
from factory.media.probe import probe, video_packet_digests
from factory.media.sound import measure_loudness
from factory.pipeline import files
from factory.pipeline.chunk_qc import (
    ChunkMeasure,
    joined_digests,
    joined_result,
    measure_chunk,
    seam_thumbnails,
)
from factory.pipeline.context import StageContext
from factory.pipeline.files import Segments
from factory.plan.chunks import Chunk, plan_chunks
from factory.plan.segments import SegmentPlan
from factory.plan.video import scene_ids, shown_seams, video_plan
from factory.qc import gate, pictures, report
from factory.qc.basic import expected_checks, probe_summary
from factory.qc.cuts import (
    FRAMES_EACH_SIDE,
    cut_checks,
    judge_cut,
    judge_transition,
    transition_checks,
)
from factory.qc.seams import scene_drift
from factory.stages import Stage
from factory.store import keys


def run_qc(ctx: StageContext, job: Job) -> Job:
    video = job.video
    plans = video_plan(video)
    chunks = plan_chunks(video)
    made = Segments.load(ctx.machine, job)
    limits = ctx.qc
    # Measured chunk by chunk while generation ran; a chunk that the encode stage itself
    # encoded is measured now, the same way. A measurement is found by the content of the
    # chunk files the encode stage joined (chunk_qc.py), never by their names alone.
    measures = [measure_chunk(ctx, made, chunk, joined_digests(job, chunk)) for chunk in chunks]
    renditions: dict[str, dict[str, Any]] = {}
    series: dict[str, dict[str, list[float]]] = {}
    defects: dict[str, list[list[float]]] = {"black": [], "frozen": []}
    for rendition in video.renditions:
        renditions[rendition], measured = _check_rendition(ctx, job, rendition, chunks, measures)
        series[rendition] = measured.per_frame
        content = renditions[rendition]["content"]
        for kind, limit in (("black", limits.black_seconds), ("frozen", limits.freeze_seconds)):
            defects[kind] += [r for r in content[kind] if r[1] - r[0] >= limit]
    records = [made.made[p.index] for p in plans if p.index in made.made]
    seams = [r.seam for r in records if r.index > 0 and r.seam is not None]
    colours = {str(r.index): r.colour for r in records if r.colour is not None}
    drift = scene_drift(scene_ids(job), colours)
    joins, join_checks, join_pictures = _judge_joins(ctx, job, plans, chunks, made, series)
    images = {"contact": "contact.png", "quality": "quality.png"}
    document = report.build(
        {"job_id": job.job_id},
        renditions,
        seams=seams,
        seam_checks=gate.seam_checks(seams),
        drift=drift,
        drift_checks=gate.drift_checks(drift, limits),
        segment_checks=_segment_checks(colours),
        limits=limits,
        images=images,
        cuts=joins,
        cut_checks=join_checks,
    )
    title = f"{job.job_id}: {'passed' if document['passed'] else 'FAILED'}"
    thumbs = {i: t for m, c in zip(measures, chunks, strict=True)
              for i, t in seam_thumbnails(ctx, m, c).items()}  # fmt: skip
    sheet = pictures.contact_sheet(title, _seam_pictures(plans, thumbs, seams), join_pictures)
    loudness = {r: entry["loudness"] for r, entry in renditions.items() if "loudness" in entry}
    plot = pictures.quality_plot(title, video.fps, series, seams, limits.to_dict(), defects,
                                 loudness)  # fmt: skip
    summary = _store_report(ctx, job, document, {"contact": sheet, "quality": plot})
    job = ctx.machine.checkpoint(
        job.job_id,
        attempt=job.attempt,
        updates={"qc": summary},
        stage=Stage.QC,
        event="qc.done",
        detail={"passed": document["passed"], "failures": summary["failures"]},
    )
    if not document["passed"]:
        metrics.qc_failed([failure["check"] for failure in document["failures"]])
        raise QualityGateFailed(summary["failures"])
    # A batch that requires review waits for a person before anything is published.
    after = Stage.REVIEW if ctx.machine.requires_review(job.batch) else Stage.DELIVER
    return ctx.machine.transition(job.job_id, attempt=job.attempt, to=after)


def _check_rendition(
    ctx: StageContext,
    job: Job,
    rendition: str,
    chunks: list[Chunk],
    measures: list[ChunkMeasure],
) -> tuple[dict[str, Any], PassResult]:
    """One delivered rendition: probed, its packets matched to the measured chunks, and
    checked (decode, truncation, the expected streams, content on the first rendition,
    fidelity); gives its part of the report and what stands as its measurement."""
    video, limits = job.video, ctx.qc
    with ctx.store.local_path(files.muxed(job, rendition)) as muxed:
        facts = probe(muxed)
        packets = video_packet_digests(muxed, [c.frames for c in chunks])
        sound = measure_loudness(muxed) if facts.audio is not None else None
    target = video.audio.loudness if video.audio else None
    measured = as_delivered(
        joined_result(measures, rendition, video.fps), measures, rendition, packets, video.fps
    )
    fidelity = gate.fidelity(measured, limits.vmaf_subsample) if measured.decoded_ok else None
    checks = [
        *gate.decode_checks(measured, video.frames_total),
        *gate.truncation_checks(facts, measured),
        *expected_checks(video, rendition, facts),
        *(gate.content_checks(measured, limits) if rendition == video.renditions[0] else []),
        *(gate.fidelity_checks(fidelity, limits) if fidelity else []),
        *(gate.loudness_checks(sound, target) if sound is not None else []),
    ]
    content = {"black": _runs(measured.black), "frozen": _runs(measured.frozen)}
    entry = {
        "checks": checks,
        "fidelity": fidelity,
        "content": content,
        "probe": probe_summary(facts),
    }
    if sound is not None:
        entry["loudness"] = {
            "integrated": sound.integrated, "range": sound.range, "true_peak": sound.true_peak,
            **({"target": target.integrated, "ceiling": target.true_peak} if target else {}),
            "short_term": [[round(t, 2), v] for t, v in sound.short_term[::5]],  # every 0.5 s
        }  # fmt: skip
    return entry, measured


def _segment_checks(colours: dict[str, dict[str, Any]]) -> list[gate.Check]:
    """A check per segment that it is not one flat colour (its luma spread)."""
    return [
        gate.Check(
            f"segment_{index}_spread",
            rec["spread"] >= FLAT_SPREAD,
            rec["spread"],
            FLAT_SPREAD,
            f"segment {index} is one flat colour",
        )
        for index, rec in sorted(colours.items(), key=lambda kv: int(kv[0]))
    ]


def _store_report(
    ctx: StageContext, job: Job, document: dict[str, Any], images: dict[str, bytes]
) -> dict[str, Any]:
    """Store the pictures and the report under this attempt's work folder; gives the qc
    summary recorded on the job (with the report's and the pictures' keys)."""
    video = job.video
    # Under this attempt's folder: the report and pictures of an earlier run are never
    # mistaken for this one's, and a stale holder's land beside them.
    made_keys = {name: keys.work(video.batch, video.video_id, f"{name}.png", job.attempt)
                 for name in images}  # fmt: skip
    for name, data in images.items():
        ctx.store.put_bytes(made_keys[name], data)
    report_key = keys.work(video.batch, video.video_id, "qc.json", job.attempt)
    ctx.store.put_bytes(report_key, json.dumps(document, indent=2).encode())
    return {**report.summary(document), "report": report_key, "pictures": made_keys}


def as_delivered(
    measured: PassResult,
    measures: list[ChunkMeasure],
    rendition: str,
    packets: list[tuple[int, str]],
    fps: float,
) -> PassResult:
    """The chunks' measurements stand for the delivered file only if its video packets are,
    chunk by chunk, the ones that were decoded and measured (the join and the mux copy them);
    otherwise the file does not decode as measured, and the failure says where."""
    in_file = sum(count for count, _ in packets)
    for measure, (count, digest) in zip(measures, packets, strict=False):
        expected = measure.renditions[rendition]["packets"]
        if (count, digest) != (expected["count"], expected["sha256"]):
            what = "other bytes" if count == expected["count"] else f"{count} packets"
            problem = (
                f"from {measure.first_frame / fps:.2f} s (chunk {measure.index}) the file holds "
                f"{what} where the measured chunk has {expected['count']}"
            )
            return replace(measured, decoded_ok=False, decode_error=problem, frames=in_file)
    extra = packets[len(measures)][0] if len(packets) > len(measures) else 0
    if extra:
        problem = f"{extra} packets after the last measured chunk"
        return replace(measured, decoded_ok=False, decode_error=problem, frames=in_file)
    return measured


def _seam_pictures(
    plans: list[SegmentPlan],
    thumbs: dict[int, dict[str, np.ndarray]],
    seams: list[dict[str, Any]],
) -> list[pictures.SeamPicture]:
    """The last frame written before each seam and the first after its transition, from the
    thumbnails the chunk measurements kept."""
    by_index = {s["seam"]: s for s in seams}
    shown = shown_seams(plans)
    return [
        pictures.SeamPicture(
            by_index[p.index], thumbs[p.index - 1]["last"], thumbs[p.index]["first"]
        )
        for p in plans[1:]
        if p.index in by_index and p.index in shown
    ]


def _judge_joins(
    ctx: StageContext,
    job: Job,
    plans: list[SegmentPlan],
    chunks: list[Chunk],
    made: Segments,
    series: dict[str, dict[str, list[float]]],
) -> tuple[list[dict[str, Any]], list[gate.Check], list[pictures.CutPicture]]:
    """Every join between shots, in order: a cut judged on the lossless frames beside it
    (the encodes are held to those by the fidelity checks), a transition on the delivered
    frames against the blend; with the two frames the contact sheet shows for each (the
    last of the shot before, the first after the cut or the transition)."""
    video, limits = job.video, ctx.qc
    blends = {c.segments[0].index: c.blend for c in chunks if c.blend is not None}
    entries: list[dict[str, Any]] = []
    shown = []
    for plan in plans:
        if plan.index == 0 or not plan.starts_shot:
            continue
        ending = max((p for p in plans if p.shot == plan.shot - 1 and p.owned_count),
                     key=lambda p: p.index)  # fmt: skip
        blend = blends.get(plan.index)
        if blend is None:
            before = _frames(ctx, made, ending, range(max(0, ending.owned_count - FRAMES_EACH_SIDE),
                                                      ending.owned_count))  # fmt: skip
            after = _frames(ctx, made, plan, range(min(FRAMES_EACH_SIDE, plan.owned_count)))
            score = judge_cut(before, after, cut=plan.index, frame=plan.write_start, fps=video.fps)
            entries.append(score.to_dict())
            shown.append((before[-1], after[0]))
            continue
        entries.append(judge_transition(
            series[video.renditions[0]], cut=plan.index, name=blend.transition,
            frame=blend.first_frame, frames=blend.frames, fps=video.fps,
            min_psnr=limits.min_psnr,
        ))  # fmt: skip
        after_frame = min(blend.first_frame + blend.frames, plan.write_start + plan.owned_count - 1)
        holder = next(p for p in plans if p.shot == plan.shot
                      and p.write_start <= after_frame < p.write_start + p.owned_count)  # fmt: skip
        last = _frames(ctx, made, ending, [ending.owned_count - 1])
        first = _frames(ctx, made, holder, [after_frame - holder.write_start])
        shown.append((last[0], first[0]))
    cuts = [e for e in entries if "transition" not in e]
    checks = cut_checks(cuts) + transition_checks(
        [e for e in entries if "transition" in e], limits.min_psnr
    )
    checks.sort(key=lambda c: int(c.name.split("_")[1]))
    pictures_ = [pictures.CutPicture(e, *frames) for e, frames in zip(entries, shown, strict=True)]
    return entries, checks, pictures_


def _frames(ctx: StageContext, made: Segments, plan: SegmentPlan, wanted: Any) -> np.ndarray:
    """Frames of a segment's lossless file, by their number in it."""
    wanted = list(wanted)
    with ctx.store.local_path(made.segment(plan.index)) as path:
        found = frames_at(path, wanted)
    return np.stack([found[i] for i in wanted])


def _runs(runs: list[tuple[float, float]]) -> list[list[float]]:
    return [[round(s, 3), round(e, 3)] for s, e in runs]
