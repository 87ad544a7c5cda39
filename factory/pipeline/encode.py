"""The encode stage: every rendition encoded chunk by chunk, then joined without re-encoding.

A chunk is a run of consecutive segments (about ``CHUNK_SECONDS`` of video). Chunks can be
encoded as soon as their segments are stored, while later segments are still being
generated (``ChunkEncoder``), so that little is left to do after the last segment. Every
chunk starts with a keyframe and keyframes follow every 2 s inside it, so the joined video
keeps GOPs of at most 2 s; the join writes each chunk's exact duration (frames / fps).
During a redo, a chunk holding changed frames is spliced from the version before's: only
its GOPs that hold changed frames are encoded again (factory/media/splice.py).
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from factory.infra import stopping
from factory.job import Job
from factory.media.concat import concat_copy_argv, ffconcat
from factory.media.ffmpeg import ffmpeg_exe, run
from factory.media.presets import PRESETS, encode_argv
from factory.media.splice import gop_span, keyframe_frames, splice
from factory.pipeline.chunk_qc import file_digest, measure_chunk
from factory.pipeline.chunks import chunk_key, chunk_ready, chunk_sources
from factory.pipeline.claims import LOCAL, Claims
from factory.pipeline.context import StageContext
from factory.pipeline.files import Segments
from factory.plan.chunks import Chunk, chunk_keyframes, plan_chunks
from factory.stages import Stage
from factory.store import keys

log = logging.getLogger(__name__)


CLAIM_POLL = 0.2  # seconds between looks at a chunk another holder is encoding


def encode_chunk(ctx: StageContext, made: Segments, chunk: Chunk, rendition: str,
                 keep: Callable[[], bool] | None = None) -> bool:  # fmt: skip
    """Encode one chunk of one rendition into the store. During a redo, a chunk that holds
    changed frames is made from the version before's chunk: only its GOPs that hold changed
    frames are encoded again, the others are copied (factory/media/splice.py). ``keep`` is
    asked right before the put (the claim is still this holder's); False: nothing is put."""
    video = made.job.video
    key = chunk_key(made, chunk, rendition)
    with tempfile.TemporaryDirectory(dir=ctx.work_dir(video)) as scratch:
        target = Path(scratch) / "chunk.mp4"
        if not _splice_redo(ctx, made, chunk, rendition, Path(scratch), target):
            _encode(ctx, made, chunk, rendition, Path(scratch), target)
        if keep is not None and not keep():
            log.warning("chunk %s %s: the claim expired during the encode; not put", chunk.index,
                        rendition)  # fmt: skip
            return False
        ctx.store.put_file(key, target, move=True)
        return True


def ensure_chunk(ctx: StageContext, made: Segments, chunk: Chunk, rendition: str,
                 claims: Claims | None = None) -> bool:  # fmt: skip
    """The chunk in the store, encoded once: here, unless it is there already or another
    holder is encoding it (the chunk message and the encode stage both find the last chunk
    missing), in which case this waits for that encode (or claims the chunk when that
    holder's claim expires). True when it was encoded here. Two encodes of the same frames on
    two workers may differ in bytes (docs/jobs.md): the second must not replace the first."""
    claims = claims or LOCAL
    key = chunk_key(made, chunk, rendition)
    while not ctx.store.exists(key):
        with claims.hold(key) as claim:
            if claim is not None:
                if ctx.store.exists(key):  # put between our look and our claim
                    return False
                if encode_chunk(ctx, made, chunk, rendition, keep=claim.held):
                    return True
        stopping.check()  # a holder that lost the job stops waiting
        time.sleep(CLAIM_POLL)
    return False


def _encode(ctx: StageContext, made: Segments, chunk: Chunk, rendition: str, scratch: Path,
            target: Path, frames: tuple[int, int] | None = None) -> None:  # fmt: skip
    """The chunk's frames (or only ``frames``: [first, end) of the chunk) encoded to
    ``target``, with the chunk's keyframe layout."""
    video = made.job.video
    first, end = frames or (0, chunk.frames)
    forced = None
    if video.keyframes == "segments":
        forced = [k - first for k in chunk_keyframes(video, chunk) if first <= k < end]
    # Local copies live until ffmpeg has read them (an s3 store downloads them for the call).
    # A scratch folder per call: a chunk task and the encode stage may meet on the same chunk.
    with ExitStack() as stack:
        listed, offset = [], 0
        for path, count in chunk_sources(ctx, made, chunk, stack, scratch):
            if offset < end and offset + count > first:  # only the files the frames are in
                listed.append((path, count, offset))
            offset += count
        skip = first - listed[0][2]
        entries = [(path, count) for path, count, _ in listed]
        listing = scratch / "chunk.ffconcat"
        listing.write_text(ffconcat(entries, video.fps))
        trim = (skip, skip + end - first) if frames else None
        source = (video.width, video.height)
        run(encode_argv(ffmpeg_exe(), PRESETS[rendition], video.fps, source, listing, target,
                        trim=trim, keyframes=forced))  # fmt: skip


def _splice_redo(ctx: StageContext, made: Segments, chunk: Chunk, rendition: str,
                 scratch: Path, target: Path) -> bool:  # fmt: skip
    """A running redo's chunk from the version before's: the GOPs holding the changed frames
    encoded again, the rest copied. False when there is nothing to splice into (no redo, the
    chunk holds no changed frame, or the earlier chunk is gone): encode it whole."""
    redo = made.job.progress.get("redo")
    before = made.before_redo()
    if redo is None or before is None:
        return False
    first = max(redo["changed_start"] - chunk.first_frame, 0)
    end = min(redo["changed_end"] - chunk.first_frame, chunk.frames)
    old_key = chunk_key(before, chunk, rendition)
    if first >= end or old_key == chunk_key(made, chunk, rendition):
        return False
    if not ctx.store.exists(old_key):
        return False
    video = made.job.video
    with ctx.store.local_path(old_key) as old:
        start, stop = gop_span(keyframe_frames(old, video.fps), chunk.frames, first, end)
        if (start, stop) == (0, chunk.frames):
            return False
        piece = scratch / "piece.mp4"
        _encode(ctx, made, chunk, rendition, scratch, piece, frames=(start, stop))
        tag = "hvc1" if PRESETS[rendition].is_hevc else "avc1"
        splice(old, piece, start, stop, video.fps, target, codec_tag=tag)
    log.info(
        "chunk %s %s: frames %d-%d of %d encoded again, the rest copied",
        chunk.index,
        rendition,
        start,
        stop - 1,
        chunk.frames,
    )
    return True


def chunks_done(ctx: StageContext, made: Segments) -> dict[str, set[int]]:
    """Chunks already in the store, per rendition: a chunk's name says what it was made from
    (Segments.chunk), so one that exists is the right one, whoever encoded it."""
    job = made.job
    chunks = [c for c in plan_chunks(job.video) if chunk_ready(job, c)]
    return {
        r: {c.index for c in chunks if ctx.store.exists(chunk_key(made, c, r))}
        for r in job.video.renditions
    }


def record_chunks(
    ctx: StageContext, job: Job, done: dict[str, set[int]], total: int, stage: Stage | None
) -> Job:
    """The chunks encoded so far; ``stage``: the stage the writer runs in (None: the chunk
    encoder beside generation, whose chunks stay valid when the job moves on to encode)."""
    encode = {"chunks": {r: sorted(c) for r, c in done.items()}, "chunks_total": total}
    if "epoch" in job.progress.get("encode", {}):  # a redo's: its chunks' names depend on it
        encode["epoch"] = job.progress["encode"]["epoch"]
    return ctx.machine.checkpoint(job.job_id, attempt=job.attempt, updates={"encode": encode},
                                  stage=stage)  # fmt: skip


def run_encode(ctx: StageContext, job: Job, claims: Claims | None = None) -> Job:
    video = job.video
    chunks = plan_chunks(video)
    made = Segments.load(ctx.machine, job)
    done = chunks_done(ctx, made)
    for rendition in video.renditions:
        for chunk in chunks:
            if chunk.index not in done[rendition]:
                ensure_chunk(ctx, made, chunk, rendition, claims)
                done[rendition].add(chunk.index)
                job = record_chunks(ctx, job, done, len(chunks), Stage.ENCODE)
    joined: dict[str, str] = {}
    digests: dict[str, list[str]] = {}  # the bytes of every chunk joined: QC's measurements
    for rendition in video.renditions:
        with ExitStack() as stack, tempfile.TemporaryDirectory(dir=ctx.work_dir(video)) as scratch:
            entries = [
                (stack.enter_context(ctx.store.local_path(chunk_key(made, chunk, rendition))),
                 chunk.frames)
                for chunk in chunks
            ]  # fmt: skip
            digests[rendition] = [file_digest(path) for path, _ in entries]
            listing = Path(scratch) / "join.ffconcat"
            listing.write_text(ffconcat(entries, video.fps))
            target = Path(scratch) / f"{rendition}.video.mp4"
            run(concat_copy_argv(ffmpeg_exe(), listing, target, hevc=PRESETS[rendition].is_hevc))
            joined[rendition] = keys.joined(video.batch, video.video_id, rendition, job.attempt)
            ctx.store.put_file(joined[rendition], target, move=True)
    encode = {
        "chunks": {r: sorted(c) for r, c in done.items()},
        "chunks_total": len(chunks),
        "joined": joined,
        "digests": digests,  # what the qc stage finds the chunks' measurements by
        "epoch": made.chunks_epoch,  # what the chunks joined here are named by
    }
    job = ctx.machine.checkpoint(job.job_id, attempt=job.attempt, updates={"encode": encode},
                                 stage=Stage.ENCODE)  # fmt: skip
    return ctx.machine.transition(job.job_id, attempt=job.attempt, to=Stage.MUX)


class ChunkEncoder:
    """Encodes chunks in a background thread while generation goes on (embedded mode).

    Hook it as ``StageContext.on_segment``; ``drain()`` waits for the chunks in flight and
    re-raises the first failure. Only this thread writes ``progress.encode`` meanwhile.
    """

    def __init__(self, ctx: StageContext) -> None:
        self.ctx = ctx
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chunk-encoder")
        self._futures: list[Future[None]] = []
        self._lock = threading.Lock()
        self._started: set[tuple[str, int]] = set()
        self._done: dict[str, dict[str, set[int]]] = {}

    def segment_ready(self, job: Job, segment: int) -> None:
        chunks = plan_chunks(job.video)
        with self._lock:
            if job.job_id not in self._done:
                self._done[job.job_id] = chunks_done(self.ctx, Segments.load(self.ctx.machine, job))
            done = self._done[job.job_id]
            redo = job.progress.get("redo")
            if redo and redo.get("join") is not None and segment == redo["segments"][-1]:
                # The joined segment's files are new too: its chunk was done under old names.
                for chunk in chunks:
                    if any(s.index == redo["join"] for s in chunk.made_of):
                        for indices in done.values():
                            indices.discard(chunk.index)
            for chunk in chunks:
                ready = chunk_ready(job, chunk)
                fresh = (job.job_id, chunk.index) not in self._started
                if ready and fresh and not all(chunk.index in done[r] for r in done):
                    self._started.add((job.job_id, chunk.index))
                    self._futures.append(self._pool.submit(self._encode, job, chunk, len(chunks)))

    def _encode(self, job: Job, chunk: Chunk, total: int) -> None:
        done = self._done[job.job_id]
        made = Segments.load(self.ctx.machine, job)
        for rendition in job.video.renditions:
            if chunk.index not in done[rendition]:
                ensure_chunk(self.ctx, made, chunk, rendition)
                done[rendition].add(chunk.index)
        measure_chunk(self.ctx, made, chunk)
        record_chunks(self.ctx, job, done, total, None)

    def drain(self) -> None:
        futures, self._futures = self._futures, []
        errors = [f.exception() for f in futures]
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
