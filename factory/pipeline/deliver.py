"""The deliver stage: the checked renditions, the QC report and its pictures published as a
new version of the job. Every delivery (the first, a redo's, a re-delivery after a requeue)
takes a version number no delivery of the job used before and writes under that version's
own prefix; the job's current version moves to it only after every file is stored and
verified, in the transaction that records it. A delivered version's files are never written
again (docs/jobs.md, "Versions")."""

from __future__ import annotations

import hashlib
from pathlib import Path

from factory.errors import RetryableError
from factory.infra import metrics, stopping
from factory.job import Job
from factory.pipeline import files
from factory.pipeline.context import StageContext
from factory.store import keys


def run_deliver(ctx: StageContext, job: Job) -> Job:
    """Copies what QC passed (the files its progress records) under the reserved version's
    prefix. Before each write the job is checked to be still this worker's, so a superseded
    deliver stops instead of writing; what it wrote stays under a number nobody publishes."""
    video = job.video
    taken = ctx.machine.reserve_version(
        job.job_id,
        attempt=job.attempt,
        prefix_for=lambda n: keys.delivery_prefix(video.batch, video.video_id, n),
    )
    version = taken.version
    written: dict[str, str] = {}  # key -> sha256 of what was put there
    outputs: dict[str, str] = {}

    def put(key: str, source: str) -> None:
        with ctx.store.local_path(source) as path:
            _still_held(ctx, job)
            written[key] = _sha256(path)
            ctx.store.put_file(key, path)
            if key.endswith(".mp4"):
                metrics.delivered(path.stat().st_size)

    for rendition in video.renditions:
        final = keys.output(video.batch, video.video_id, rendition, version)
        put(final, files.muxed(job, rendition))
        outputs[rendition] = ctx.store.url_for(final)
    report = keys.qc_report(video.batch, video.video_id, version)
    put(report, job.progress["qc"]["report"])
    outputs["qc"] = ctx.store.url_for(report)
    for picture in ("contact", "quality"):
        made = files.qc_picture(job, picture)
        if ctx.store.exists(made):
            final = f"{taken.prefix}/{picture}.png"
            put(final, made)
            outputs[picture] = ctx.store.url_for(final)
    _verify(ctx, written)
    return ctx.machine.commit_version(
        job.job_id, attempt=job.attempt, version=version, outputs=outputs
    )


def _verify(ctx: StageContext, written: dict[str, str]) -> None:
    """Every file of the version is in the store with the bytes that were put there."""
    for key, sha256 in written.items():
        info = ctx.store.stat(key)
        if info is None:
            raise RetryableError(f"delivery check: {key} is not in the store after it was put")
        if info.sha256 is None:  # the file store records none: read it back
            with ctx.store.local_path(key) as path:
                found = _sha256(path)
        else:
            found = info.sha256
        if found != sha256:
            raise RetryableError(f"delivery check: {key} holds other bytes than were put")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        for block in iter(lambda: source.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _still_held(ctx: StageContext, job: Job) -> None:
    stopping.check()
    ctx.machine.heartbeat(job.job_id, attempt=job.attempt)  # StaleAttempt if it is not
