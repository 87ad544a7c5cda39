"""The deliver stage: the checked renditions and the QC report under their final keys."""

from __future__ import annotations

from factory import metrics
from factory.db.state import Job
from factory.pipeline.context import StageContext
from factory.stages import Stage
from factory.store import keys


def run_deliver(ctx: StageContext, job: Job) -> Job:
    video = job.video
    outputs: dict[str, str] = {}
    for rendition in video.renditions:
        final = keys.output(video.batch, video.video_id, rendition)
        with ctx.store.local_path(keys.muxed(video.batch, video.video_id, rendition)) as path:
            ctx.store.put_file(final, path)
            metrics.delivered(path.stat().st_size)
        outputs[rendition] = ctx.store.url_for(final)
    report = keys.qc_report(video.batch, video.video_id)
    with ctx.store.local_path(job.progress["qc"]["report"]) as path:
        ctx.store.put_file(report, path)
    outputs["qc"] = ctx.store.url_for(report)
    prefix = f"{video.batch}/{video.video_id}"
    for picture in ("contact", "quality"):
        made = f"{prefix}/work/{picture}.png"
        if ctx.store.exists(made):
            with ctx.store.local_path(made) as path:
                ctx.store.put_file(f"{prefix}/{picture}.png", path)
            outputs[picture] = ctx.store.url_for(f"{prefix}/{picture}.png")
    job = ctx.machine.checkpoint(
        job.job_id, attempt=job.attempt, updates={"deliver": {"outputs": outputs}}
    )
    return ctx.machine.transition(job.job_id, attempt=job.attempt, to=Stage.DONE)
