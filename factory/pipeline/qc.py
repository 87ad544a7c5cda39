"""The qc stage: probe every muxed rendition, write the report, stop the job if it fails."""

from __future__ import annotations

import json

from factory.db.state import Job
from factory.errors import QualityGateFailed
from factory.media.probe import probe
from factory.pipeline.context import StageContext
from factory.qc.basic import check_rendition, report
from factory.stages import Stage
from factory.store import keys


def run_qc(ctx: StageContext, job: Job) -> Job:
    video = job.video
    results = {}
    for rendition in video.renditions:
        with ctx.store.local_path(keys.muxed(video.batch, video.video_id, rendition)) as path:
            results[rendition] = check_rendition(video, rendition, probe(path))
    document = report(job.job_id, results)
    report_key = f"{video.batch}/{video.video_id}/work/qc.json"
    ctx.store.put_bytes(report_key, json.dumps(document, indent=2).encode())
    summary = {
        "passed": document["passed"],
        "failures": document["failures"][:10],
        "report": report_key,
    }
    job = ctx.machine.checkpoint(
        job.job_id,
        attempt=job.attempt,
        updates={"qc": summary},
        event="qc.done",
        detail={"passed": document["passed"]},
    )
    if not document["passed"]:
        raise QualityGateFailed(document["failures"])
    return ctx.machine.transition(job.job_id, attempt=job.attempt, to=Stage.DELIVER)
