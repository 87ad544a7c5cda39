"""The deliver stage: the checked renditions and the QC report under their final keys."""

from __future__ import annotations

from factory import metrics, stopping
from factory.db.state import Job
from factory.pipeline import files
from factory.pipeline.context import StageContext
from factory.stages import Stage
from factory.store import keys


def run_deliver(ctx: StageContext, job: Job) -> Job:
    """Copies what QC passed (the files its progress records) to the final keys. The previous
    delivery stays under them until this one has passed QC; before each final write the job
    is checked to be still this worker's, so a superseded deliver stops instead of writing."""
    video = job.video
    outputs: dict[str, str] = {}
    for rendition in video.renditions:
        final = keys.output(video.batch, video.video_id, rendition)
        with ctx.store.local_path(files.muxed(job, rendition)) as path:
            _still_held(ctx, job)
            ctx.store.put_file(final, path)
            metrics.delivered(path.stat().st_size)
        outputs[rendition] = ctx.store.url_for(final)
    report = keys.qc_report(video.batch, video.video_id)
    with ctx.store.local_path(job.progress["qc"]["report"]) as path:
        _still_held(ctx, job)
        ctx.store.put_file(report, path)
    outputs["qc"] = ctx.store.url_for(report)
    prefix = keys.job_prefix(video.batch, video.video_id)
    for picture in ("contact", "quality"):
        made = files.qc_picture(job, picture)
        if ctx.store.exists(made):
            with ctx.store.local_path(made) as path:
                _still_held(ctx, job)
                ctx.store.put_file(f"{prefix}/{picture}.png", path)
            outputs[picture] = ctx.store.url_for(f"{prefix}/{picture}.png")
    job = ctx.machine.checkpoint(
        job.job_id, attempt=job.attempt, updates={"deliver": {"outputs": outputs}}
    )
    return ctx.machine.transition(job.job_id, attempt=job.attempt, to=Stage.DONE)


def _still_held(ctx: StageContext, job: Job) -> None:
    stopping.check()
    ctx.machine.heartbeat(job.job_id, attempt=job.attempt)  # StaleAttempt if it is not
