"""The store keys of one job's files, as its records say (factory.store.keys says why they
carry attempts and digests). A segment's files are named by the attempt (and the shot
holder) that made it, which its row in `job_segments` records: `Segments.load` reads those
rows once per stage."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from factory.db.state import JobStateMachine
from factory.errors import PermanentError
from factory.job import Job, SegmentRecord
from factory.store import keys


@dataclass(frozen=True)
class Segments:
    """A job's recorded segments and the keys of their files."""

    job: Job
    made: Mapping[int, SegmentRecord]

    @classmethod
    def load(cls, machine: JobStateMachine, job: Job) -> Segments:
        return cls(job, machine.segments(job.job_id))

    def attempt(self, index: int) -> int | None:
        record = self.made.get(index)
        if record is None:
            raise PermanentError(f"job {self.job.job_id}: segment {index} is not recorded")
        return record.attempt

    def holder(self, index: int) -> str | None:
        self.attempt(index)  # recorded
        return self.made[index].holder

    def segment(self, index: int) -> str:
        job = self.job
        return keys.segment(job.batch, job.video_id, index, self.attempt(index), self.holder(index))

    def tail(self, index: int) -> str:
        job = self.job
        return keys.tail(job.batch, job.video_id, index, self.attempt(index), self.holder(index))

    def carry(self, index: int) -> str:
        job = self.job
        return keys.carry(job.batch, job.video_id, index, self.attempt(index), self.holder(index))

    def thumbs(self, index: int) -> str:
        """Seam thumbnails kept with a segment by the code before per-chunk QC."""
        return keys.thumbs(self.job.batch, self.job.video_id, index, self.attempt(index))

    @property
    def chunks_epoch(self) -> int:
        """The epoch the job's chunks are named by: the one the encode stage joined them under
        once it has (a requeue --from mux or qc starts a new epoch but keeps those chunks),
        else the job's current one."""
        encode = self.job.progress.get("encode", {})
        if "epoch" in encode:  # set once joined, and by a redo (the delivered version's)
            return int(encode["epoch"])
        return int(self.job.progress.get("epoch", 0))

    def before_redo(self) -> Segments | None:
        """The segments as the version a running redo replaces had them (the names of its
        chunks), or None without a redo or for one started before these were recorded."""
        redo = self.job.progress.get("redo") or {}
        previous = redo.get("previous")
        if previous is None:
            return None
        holders = redo.get("previous_holders") or {}
        made = {**self.made}
        for index, attempt in previous.items():
            record = made.get(int(index))
            if record is not None:
                made[int(index)] = replace(record, attempt=attempt, holder=holders.get(index))
        return Segments(self.job, made)

    def chunk(self, rendition: str, index: int, segments: Iterable[int],
              blend: tuple[str, int] | None = None) -> str:  # fmt: skip
        """A chunk named by what it is made of: the epoch (bumped by every requeue --from),
        the segment files and the transition it blends them with, so a chunk left by an
        earlier run (or made with another join) is never joined into a later one."""
        made_of: dict[str, object] = {
            "epoch": self.chunks_epoch,
            "rendition": rendition,
            "segments": [self.segment(s) for s in segments],
        }
        if blend is not None:  # (absent otherwise: chunks without one keep their names)
            made_of["blend"] = list(blend)
        digest = hashlib.sha256(json.dumps(made_of, sort_keys=True).encode()).hexdigest()[:16]
        return keys.chunk(self.job.batch, self.job.video_id, rendition, index, digest)


def joined(job: Job, rendition: str) -> str:
    recorded = job.progress.get("encode", {}).get("joined", {})
    return recorded.get(rendition) or keys.joined(job.batch, job.video_id, rendition)


def muxed(job: Job, rendition: str) -> str:
    recorded = job.progress.get("mux", {}).get("muxed", {})
    return recorded.get(rendition) or keys.muxed(job.batch, job.video_id, rendition)


def qc_picture(job: Job, name: str) -> str:
    recorded = job.progress.get("qc", {}).get("pictures", {})
    return recorded.get(name) or keys.work(job.batch, job.video_id, f"{name}.png")
