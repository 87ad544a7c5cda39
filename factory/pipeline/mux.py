"""The mux stage: one AAC track over the whole video (the audio asset looped or padded to
length, or silence), muxed onto every rendition with the video stream copied."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from factory.errors import PermanentError
from factory.job import Job
from factory.media.audio import audio_argv, mux_argv
from factory.media.ffmpeg import atomic_output, ffmpeg_exe, run
from factory.media.presets import PRESETS
from factory.pipeline import files
from factory.pipeline.context import StageContext
from factory.spec import AudioChoice
from factory.stages import Stage
from factory.store import keys


def run_mux(ctx: StageContext, job: Job) -> Job:
    """Reads the joined videos that the encode stage recorded; writes under this attempt."""
    video = job.video
    audio_key = keys.audio(video.batch, video.video_id, job.attempt)
    with tempfile.TemporaryDirectory(dir=ctx.work_dir(video)) as scratch:
        work = Path(scratch)
        with _asset_path(ctx, video.audio) as source, atomic_output(work / "audio.m4a") as tmp:
            gain, loop = (video.audio.gain_db, video.audio.loop) if video.audio else (0.0, True)
            duration = video.frames_total / video.fps
            run(audio_argv(ffmpeg_exe(), source, duration, tmp, gain_db=gain, loop=loop))
        ctx.store.put_file(audio_key, work / "audio.m4a", move=True)
        muxed: dict[str, str] = {}
        for rendition in video.renditions:
            target = work / f"{rendition}.mp4"
            with (
                ctx.store.local_path(files.joined(job, rendition)) as joined,
                ctx.store.local_path(audio_key) as audio,
                atomic_output(target) as tmp,
            ):
                run(mux_argv(ffmpeg_exe(), joined, audio, tmp, hevc=PRESETS[rendition].is_hevc))
            muxed[rendition] = keys.muxed(video.batch, video.video_id, rendition, job.attempt)
            ctx.store.put_file(muxed[rendition], target, move=True)
    job = ctx.machine.checkpoint(
        job.job_id, attempt=job.attempt, updates={"mux": {"audio": audio_key, "muxed": muxed}}
    )
    return ctx.machine.transition(job.job_id, attempt=job.attempt, to=Stage.QC)


@contextmanager
def _asset_path(ctx: StageContext, audio: AudioChoice | None) -> Iterator[Path | None]:
    """The audio bed through the node's asset cache (fetched once, checked by sha256)."""
    if audio is None:
        yield None
        return
    if ctx.assets is None:
        raise PermanentError("no asset cache configured for this worker")
    with ctx.assets.local_path(audio.asset) as path:
        yield path
