"""Chunks as the encode and QC stages find them: a chunk's key in the store (named by the
segment files it is made of) and whether its segments are recorded. What a chunk is, which
segments each holds and where its GOPs start is pure planning, in factory/plan/chunks.py."""

from __future__ import annotations

from factory.job import Job
from factory.pipeline.files import Segments
from factory.plan.chunks import Chunk


def chunk_key(made: Segments, chunk: Chunk, rendition: str) -> str:
    return made.chunk(rendition, chunk.index, [s.index for s in chunk.segments])


def chunk_ready(job: Job, chunk: Chunk) -> bool:
    """Every segment of the chunk is recorded as done (its files are the recorded ones)."""
    done = set(job.progress["segments"])
    return all(s.index in done for s in chunk.segments)
