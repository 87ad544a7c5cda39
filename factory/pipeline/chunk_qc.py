"""The quality gate's per-chunk half: as soon as a chunk is encoded in every rendition (while
later segments are still being generated), its renditions are decoded and compared frame by
frame with the chunk's lossless segments (PSNR-Y, SSIM, VMAF), checked for black and frozen
runs, their packets fingerprinted, and the seam thumbnails of its segments kept. The qc
stage then only joins these measurements and checks the whole files (docs/qc.md): what is
left after the last segment is the last chunk, the joins, the audio and the probes.

A measurement is stored under a name made of the content (sha256) of the chunk files it
measured (and the subsampling): it stands for those bytes and no others, whoever encoded them
and whenever (two encodes of one chunk on two workers may differ in bytes), and one left by
an earlier run can never stand for other chunks. The encode stage records the digests of the
chunks it joined (``progress.encode.digests``); the qc stage finds their measurements by them.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from factory.job import Job
from factory.media.analyze import PassResult, Reference, analyze
from factory.media.frames import frames_at
from factory.media.probe import video_packet_digests
from factory.pipeline.chunks import chunk_key, chunk_sources
from factory.pipeline.context import StageContext
from factory.pipeline.files import Segments
from factory.plan.chunks import Chunk
from factory.qc import pictures
from factory.store import keys

SCHEMA = "factory.chunk-qc/1"


@dataclass(frozen=True)
class ChunkMeasure:
    """One chunk measured: per rendition what the analysis pass found, with frame numbers and
    times already those of the whole video."""

    index: int
    first_frame: int
    frames: int
    renditions: dict[str, dict[str, Any]]  # PassResult fields + packets (count, sha256)
    black: list[list[float]]  # seconds in the video, on the first rendition
    frozen: list[list[float]]
    thumbs_key: str  # per segment of the chunk: its first frame after the seam, its last

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **self.__dict__}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChunkMeasure:
        return cls(**{k: v for k, v in data.items() if k != "schema"})


def first_frame(chunk: Chunk) -> int:
    return chunk.segments[0].write_start


def file_digest(path: Path) -> str:
    """A file's content digest (sha256, 32 hex digits): what a chunk measurement is named by."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:32]


def joined_digests(job: Job, chunk: Chunk) -> dict[str, str] | None:
    """The content digests of the chunk's files the encode stage joined, per rendition (None
    before the join, or for a job joined before digests were recorded)."""
    recorded = job.progress.get("encode", {}).get("digests")
    if not recorded:
        return None
    try:
        return {r: recorded[r][chunk.index] for r in job.video.renditions}
    except (KeyError, IndexError):
        return None


def measure_key(
    ctx: StageContext, made: Segments, chunk: Chunk, suffix: str, digests: dict[str, str]
) -> str:
    """Named by the content of the chunk files measured (``digests``: per rendition)."""
    video = made.job.video
    made_of = {
        "content": [digests[r] for r in video.renditions],
        "subsample": ctx.qc.vmaf_subsample,
    }
    digest = hashlib.sha256(json.dumps(made_of, sort_keys=True).encode()).hexdigest()[:16]
    return keys.chunk_qc(video.batch, video.video_id, chunk.index, digest, suffix)


def stored_measure(
    ctx: StageContext, made: Segments, chunk: Chunk, digests: dict[str, str]
) -> ChunkMeasure | None:
    key = measure_key(ctx, made, chunk, "json", digests)
    if not ctx.store.exists(key):
        return None
    with ctx.store.local_path(key) as path:
        data = json.loads(path.read_text())
    return ChunkMeasure.from_dict(data) if data.get("schema") == SCHEMA else None


def measure_chunk(
    ctx: StageContext, made: Segments, chunk: Chunk, digests: dict[str, str] | None = None
) -> ChunkMeasure:
    """The measurement of the chunk's files: the stored one for their content, or made now
    (and stored) from its encoded renditions and its segment files. ``digests``: the content
    of the files that were joined (joined_digests), whose stored measurement is looked up
    without reading them; the chunk files in the store are read and digested otherwise."""
    if digests is not None:
        found = stored_measure(ctx, made, chunk, digests)
        if found is not None:
            return found
    video = made.job.video
    names = list(video.renditions)
    start = first_frame(chunk)
    offset = start / video.fps
    with ExitStack() as stack:
        encoded = {r: stack.enter_context(ctx.store.local_path(chunk_key(made, chunk, r)))
                   for r in names}  # fmt: skip
        content = {r: file_digest(encoded[r]) for r in names}  # what is measured
        if content != digests:
            found = stored_measure(ctx, made, chunk, content)
            if found is not None:
                return found
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=ctx.work_dir(video))))
        segments = [stack.enter_context(ctx.store.local_path(made.segment(s.index)))
                    for s in chunk.segments]  # fmt: skip
        sources = chunk_sources(ctx, made, chunk, stack, work)  # what was encoded
        reference = Reference(sources, video.width, video.height)
        results = analyze(
            encoded,
            video.fps,
            chunk.frames / video.fps,
            reference=reference,
            work=work / "analysis",
            subsample=ctx.qc.vmaf_subsample,
            content_on=names[0],
        )
        renditions = {
            r: _rendition(results[r], start, video_packet_digests(encoded[r], [chunk.frames])[0])
            for r in names
        }
        strip = pictures.thumb_strip(_seam_frames(chunk, segments))
    first = results[names[0]]
    measure = ChunkMeasure(
        index=chunk.index,
        first_frame=start,
        frames=chunk.frames,
        renditions=renditions,
        black=[[round(a + offset, 4), round(b + offset, 4)] for a, b in first.black],
        frozen=[[round(a + offset, 4), round(b + offset, 4)] for a, b in first.frozen],
        thumbs_key=measure_key(ctx, made, chunk, "png", content),
    )
    ctx.store.put_bytes(measure.thumbs_key, strip)
    body = json.dumps(measure.to_dict()).encode()
    ctx.store.put_bytes(measure_key(ctx, made, chunk, "json", content), body)
    return measure


def seam_thumbnails(ctx: StageContext, measure: ChunkMeasure, chunk: Chunk) -> dict[int, dict]:
    """{segment index: {"first": frame after its seam, "last": its last frame}}."""
    with ctx.store.local_path(measure.thumbs_key) as path:
        strip = pictures.read_strip(path.read_bytes(), 2 * len(chunk.segments))
    return {
        s.index: {"first": strip[2 * i], "last": strip[2 * i + 1]}
        for i, s in enumerate(chunk.segments)
    }


def joined_result(measures: list[ChunkMeasure], rendition: str, fps: float) -> PassResult:
    """The chunks' measurements of one rendition as one pass over the whole video would have
    given them (runs that meet at a chunk boundary are one run)."""
    parts = [m.renditions[rendition] for m in measures]
    series: dict[str, list[float]] = {}
    for part in parts:
        for name, values in part["per_frame"].items():
            series.setdefault(name, []).extend(values)
    failed = next((p for p in parts if not p["decoded_ok"]), None)
    frames = [p["frames"] for p in parts]
    return PassResult(
        decoded_ok=failed is None,
        decode_error=failed["decode_error"] if failed else "",
        frames=None if None in frames else sum(frames),
        black=merge_runs([(m.first_frame / fps, m.black) for m in measures], fps),
        frozen=merge_runs([(m.first_frame / fps, m.frozen) for m in measures], fps),
        per_frame=series,
        vmaf_available=all(p["vmaf_available"] for p in parts),
        fidelity_source=parts[0]["fidelity_source"] if parts else "",
    )


def merge_runs(
    per_chunk: list[tuple[float, list[list[float]]]], fps: float
) -> list[tuple[float, float]]:
    """Each chunk's runs (with the chunk's start in seconds), in order; a run that reaches the
    end of its chunk and one that starts the next chunk are one run that crossed the
    boundary. Runs within a chunk stay as its pass reported them."""
    slack = 1.5 / fps
    merged: list[list[float]] = []
    for start, runs in per_chunk:
        for a, b in sorted(runs):
            if merged and abs(a - start) <= slack and abs(merged[-1][1] - start) <= slack:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
    return [(a, b) for a, b in merged]


def _rendition(result: PassResult, start: int, packets: tuple[int, str]) -> dict[str, Any]:
    per_frame = dict(result.per_frame)
    if "frame" in per_frame:
        per_frame["frame"] = [f + start for f in per_frame["frame"]]
    return {
        "decoded_ok": result.decoded_ok,
        "decode_error": result.decode_error,
        "frames": result.frames,
        "per_frame": per_frame,
        "vmaf_available": result.vmaf_available,
        "fidelity_source": result.fidelity_source,
        "packets": {"count": packets[0], "sha256": packets[1]},
    }


def _seam_frames(chunk: Chunk, segments: list[Path]) -> list[np.ndarray]:
    frames = []
    for plan, path in zip(chunk.segments, segments, strict=True):
        after, last = min(plan.context, plan.owned_count - 1), plan.owned_count - 1
        found = frames_at(path, [after, last])
        frames += [found[after], found[last]]
    return frames
