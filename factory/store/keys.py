"""Where everything of a job lives in the store: `{batch}/{video}/…` (DESIGN.md).

Files that a checkpoint will point at are never shared between writers, so a worker that
lost its job (a stale holder) can never change what the new holder committed:

- a segment's files carry the attempt that made them (`segments/00003-a12.mkv`) and, for a
  video whose shots several GPUs make under one attempt, the holder's lease
  (`segments/00003-a12-h3f9c0d1e2b4a.mkv`); its row in `job_segments` records both;
- what a stage derives (joined video, audio, muxed renditions, QC report and pictures) lies
  under `work/a{attempt}/` of the attempt that ran the stage, recorded in its progress key;
- a chunk is named by what it is made of (the epoch and the segment files, hashed): two
  writers of one chunk name write the same thing, and a chunk made from other segments
  can never be picked up.

``attempt=None`` gives the names used before attempts were part of them (jobs in flight
across the upgrade keep reading their files).
"""

from __future__ import annotations


def job_prefix(batch: str, video: str) -> str:
    return f"{batch}/{video}"


def _segment_stem(
    batch: str, video: str, index: int, attempt: int | None, holder: str | None = None
) -> str:
    suffix = "" if attempt is None else f"-a{attempt}"
    suffix += f"-h{holder}" if holder else ""
    return f"{batch}/{video}/segments/{index:05d}{suffix}"


def segment(
    batch: str, video: str, index: int, attempt: int | None = None, holder: str | None = None
) -> str:
    """A segment's lossless file; ``holder``: the lease of the shot holder that made it (the
    holders of one video's shots share an attempt, never a file)."""
    return _segment_stem(batch, video, index, attempt, holder) + ".mkv"


def tail(
    batch: str, video: str, index: int, attempt: int | None = None, holder: str | None = None
) -> str:
    return _segment_stem(batch, video, index, attempt, holder) + ".tail.npy"


def carry(
    batch: str, video: str, index: int, attempt: int | None = None, holder: str | None = None
) -> str:
    """What a latent family's next segment continues from (factory.generate.latent_backend)."""
    return _segment_stem(batch, video, index, attempt, holder) + ".carry.safetensors"


def past(
    batch: str, video: str, operation: int, index: int, attempt: int, holder: str | None = None
) -> str:
    """Segment ``index`` as it stood after operation ``operation`` of the job's lineage, made
    again to replay a join (factory/pipeline/lineage.py) by ``attempt`` (and the shot holder
    ``holder``): like a segment, never a file another writer writes too; under segments/ so
    that gc takes it with the segments. The tail beside it: the same name + ``.tail.npy``."""
    stem = f"a{attempt}" + (f"-h{holder}" if holder else "")
    return f"{batch}/{video}/segments/past-{stem}-o{operation}-{index:05d}.mkv"


def thumbs(batch: str, video: str, index: int, attempt: int | None = None) -> str:
    """Small pictures of a segment's first frame after its seam and its last written frame."""
    return _segment_stem(batch, video, index, attempt) + ".thumbs.png"


def chunk(batch: str, video: str, rendition: str, index: int, digest: str = "") -> str:
    name = f"{index:05d}-{digest}" if digest else f"{index:05d}"
    return f"{batch}/{video}/chunks/{rendition}/{name}.mp4"


def chunk_qc(batch: str, video: str, index: int, digest: str, suffix: str) -> str:
    """A chunk's quality measurements (``json``) or its seam thumbnails (``png``), named by
    the chunks they were measured on."""
    return f"{batch}/{video}/chunks/qc/{index:05d}-{digest}.{suffix}"


def work(batch: str, video: str, name: str, attempt: int | None = None) -> str:
    """A file a CPU stage derives, under the attempt that ran the stage."""
    folder = "work" if attempt is None else f"work/a{attempt}"
    return f"{batch}/{video}/{folder}/{name}"


def joined(batch: str, video: str, rendition: str, attempt: int | None = None) -> str:
    return work(batch, video, f"{rendition}.video.mp4", attempt)


def audio(batch: str, video: str, attempt: int | None = None) -> str:
    return work(batch, video, "audio.m4a", attempt)


def muxed(batch: str, video: str, rendition: str, attempt: int | None = None) -> str:
    return work(batch, video, f"{rendition}.mp4", attempt)


def delivery_prefix(batch: str, video: str, version: int = 1) -> str:
    """Where a delivered version lives: version 1 at the job's own prefix (as before versions
    existed), a redo's version N under `v{N}/` beside it; no version overwrites another."""
    return f"{batch}/{video}" if version <= 1 else f"{batch}/{video}/v{version}"


def output(batch: str, video: str, rendition: str, version: int = 1) -> str:
    return f"{delivery_prefix(batch, video, version)}/out/{rendition}.mp4"


def qc_report(batch: str, video: str, version: int = 1) -> str:
    return f"{delivery_prefix(batch, video, version)}/qc.json"
