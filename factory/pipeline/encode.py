"""The encode stage: every rendition encoded chunk by chunk, then joined without re-encoding.

A chunk is a run of consecutive segments (about ``CHUNK_SECONDS`` of video). Chunks can be
encoded as soon as their segments are stored, while later segments are still being
generated (``ChunkEncoder``), so that little is left to do after the last segment. Every
chunk starts with a keyframe and keyframes follow every 2 s inside it, so the joined video
keeps GOPs of at most 2 s; the join writes each chunk's exact duration (frames / fps).
"""

from __future__ import annotations

import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from factory.db.state import Job
from factory.media.concat import concat_copy_argv, ffconcat
from factory.media.ffmpeg import ffmpeg_exe, run
from factory.media.presets import PRESETS, encode_argv
from factory.pipeline.chunk_qc import measure_chunk
from factory.pipeline.chunks import Chunk, chunk_key, chunk_ready, plan_chunks
from factory.pipeline.context import StageContext
from factory.pipeline.files import Segments
from factory.stages import Stage
from factory.store import keys


def encode_chunk(ctx: StageContext, made: Segments, chunk: Chunk, rendition: str) -> None:
    job = made.job
    video = job.video
    preset = PRESETS[rendition]
    # Local copies live until ffmpeg has read them (an s3 store downloads them for the call).
    # A scratch folder per call: a chunk task and the encode stage may meet on the same chunk.
    with ExitStack() as stack, tempfile.TemporaryDirectory(dir=ctx.work_dir(video)) as scratch:
        entries = [
            (stack.enter_context(ctx.store.local_path(made.segment(segment.index))),
             segment.write_count)
            for segment in chunk.segments
        ]  # fmt: skip
        listing = Path(scratch) / "chunk.ffconcat"
        listing.write_text(ffconcat(entries, video.fps))
        target = Path(scratch) / "chunk.mp4"
        source = (video.width, video.height)
        run(encode_argv(ffmpeg_exe(), preset, video.fps, source, listing, target))
        ctx.store.put_file(chunk_key(made, chunk, rendition), target, move=True)


def chunks_done(ctx: StageContext, made: Segments) -> dict[str, set[int]]:
    """Chunks already in the store, per rendition: a chunk's name says what it was made from
    (Segments.chunk), so one that exists is the right one, whoever encoded it."""
    job = made.job
    chunks = [c for c in plan_chunks(job.video) if chunk_ready(job, c)]
    return {
        r: {c.index for c in chunks if ctx.store.exists(chunk_key(made, c, r))}
        for r in job.video.renditions
    }


def record_chunks(ctx: StageContext, job: Job, done: dict[str, set[int]], total: int) -> Job:
    encode = {"chunks": {r: sorted(c) for r, c in done.items()}, "chunks_total": total}
    return ctx.machine.checkpoint(job.job_id, attempt=job.attempt, updates={"encode": encode})


def run_encode(ctx: StageContext, job: Job) -> Job:
    video = job.video
    chunks = plan_chunks(video)
    made = Segments.load(ctx.machine, job)
    done = chunks_done(ctx, made)
    for rendition in video.renditions:
        for chunk in chunks:
            if chunk.index not in done[rendition]:
                encode_chunk(ctx, made, chunk, rendition)
                done[rendition].add(chunk.index)
                job = record_chunks(ctx, job, done, len(chunks))
    joined: dict[str, str] = {}
    for rendition in video.renditions:
        with ExitStack() as stack, tempfile.TemporaryDirectory(dir=ctx.work_dir(video)) as scratch:
            entries = [
                (stack.enter_context(ctx.store.local_path(chunk_key(made, chunk, rendition))),
                 chunk.frames)
                for chunk in chunks
            ]  # fmt: skip
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
        "epoch": made.chunks_epoch,  # what the chunks joined here are named by
    }
    job = ctx.machine.checkpoint(job.job_id, attempt=job.attempt, updates={"encode": encode})
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

    def segment_ready(self, job: Job, _segment: int) -> None:
        chunks = plan_chunks(job.video)
        with self._lock:
            if job.job_id not in self._done:
                self._done[job.job_id] = chunks_done(self.ctx, Segments.load(self.ctx.machine, job))
            done = self._done[job.job_id]
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
                encode_chunk(self.ctx, made, chunk, rendition)
                done[rendition].add(chunk.index)
        measure_chunk(self.ctx, made, chunk)
        record_chunks(self.ctx, job, done, total)

    def drain(self) -> None:
        futures, self._futures = self._futures, []
        errors = [f.exception() for f in futures]
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
