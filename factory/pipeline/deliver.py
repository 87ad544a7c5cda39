"""The deliver stage: the checked renditions and the QC report under their final keys, as a
version: a redo delivers version N under `v{N}/` beside the earlier ones (factory/redo.py);
a requeue delivers the job's current version again."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

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
    version = delivered_version(job)
    outputs: dict[str, str] = {}
    for rendition in video.renditions:
        final = keys.output(video.batch, video.video_id, rendition, version)
        with ctx.store.local_path(files.muxed(job, rendition)) as path:
            _still_held(ctx, job)
            ctx.store.put_file(final, path)
            metrics.delivered(path.stat().st_size)
        outputs[rendition] = ctx.store.url_for(final)
    report = keys.qc_report(video.batch, video.video_id, version)
    with ctx.store.local_path(job.progress["qc"]["report"]) as path:
        _still_held(ctx, job)
        ctx.store.put_file(report, path)
    outputs["qc"] = ctx.store.url_for(report)
    prefix = keys.delivery_prefix(video.batch, video.video_id, version)
    for picture in ("contact", "quality"):
        made = files.qc_picture(job, picture)
        if ctx.store.exists(made):
            with ctx.store.local_path(made) as path:
                _still_held(ctx, job)
                ctx.store.put_file(f"{prefix}/{picture}.png", path)
            outputs[picture] = ctx.store.url_for(f"{prefix}/{picture}.png")
    entry: dict[str, Any] = {"version": version, "outputs": outputs,
                             "at": datetime.now(UTC).isoformat(timespec="seconds")}  # fmt: skip
    redo = job.progress.get("redo")
    if redo:
        entry |= {"reason": redo.get("reason", ""), "actor": redo.get("actor", ""),
                  "range": [redo["start"], redo["end"]], "segments": redo["segments"],
                  "join": redo.get("join"), "chunks": redo["chunks"]}  # fmt: skip
    earlier = [v for v in job.progress.get("versions", []) if v["version"] != version]
    updates = {
        "deliver": {"outputs": outputs, "version": version},
        "versions": sorted([*earlier, entry], key=lambda v: v["version"]),
        "redo": None,  # done: what it was is in its version's entry
    }
    job = ctx.machine.checkpoint(
        job.job_id,
        attempt=job.attempt,
        updates=updates,
        event="redo.delivered" if redo else None,
        detail={"version": version} if redo else None,
    )
    return ctx.machine.transition(job.job_id, attempt=job.attempt, to=Stage.DONE)


def delivered_version(job: Job) -> int:
    """The version this delivery is: a running redo's, else the job's current one."""
    redo = job.progress.get("redo")
    if redo:
        return int(redo["version"])
    return int(job.progress.get("deliver", {}).get("version", 1))


def _still_held(ctx: StageContext, job: Job) -> None:
    stopping.check()
    ctx.machine.heartbeat(job.job_id, attempt=job.attempt)  # StaleAttempt if it is not
