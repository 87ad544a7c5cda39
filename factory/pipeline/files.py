"""The store keys of one job's files, as its progress records them (factory.store.keys says
why they carry attempts and digests)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

from factory.db.state import Job
from factory.store import keys


def segment_attempt(job: Job, index: int) -> int | None:
    """The attempt whose segment `index` the checkpoint recorded (None: made before attempts
    were part of the names)."""
    return job.progress.get("segment_attempts", {}).get(str(index))


def segment(job: Job, index: int) -> str:
    return keys.segment(job.batch, job.video_id, index, segment_attempt(job, index))


def tail(job: Job, index: int) -> str:
    return keys.tail(job.batch, job.video_id, index, segment_attempt(job, index))


def thumbs(job: Job, index: int) -> str:
    return keys.thumbs(job.batch, job.video_id, index, segment_attempt(job, index))


def chunk(job: Job, rendition: str, index: int, segments: Iterable[int]) -> str:
    """A chunk named by what it is made of: the epoch (bumped by every requeue --from) and the
    segment files, so a chunk left by an earlier run is never joined into a later one."""
    made_of = {
        "epoch": job.progress.get("epoch", 0),
        "rendition": rendition,
        "segments": [segment(job, s) for s in segments],
    }
    digest = hashlib.sha256(json.dumps(made_of, sort_keys=True).encode()).hexdigest()[:16]
    return keys.chunk(job.batch, job.video_id, rendition, index, digest)


def joined(job: Job, rendition: str) -> str:
    recorded = job.progress.get("encode", {}).get("joined", {})
    return recorded.get(rendition) or keys.joined(job.batch, job.video_id, rendition)


def muxed(job: Job, rendition: str) -> str:
    recorded = job.progress.get("mux", {}).get("muxed", {})
    return recorded.get(rendition) or keys.muxed(job.batch, job.video_id, rendition)


def qc_picture(job: Job, name: str) -> str:
    recorded = job.progress.get("qc", {}).get("pictures", {})
    return recorded.get(name) or keys.work(job.batch, job.video_id, f"{name}.png")
