"""The mux stage: one AAC track over the whole video (the bed looped or padded to length, or
silence, with the cues mixed over it at their times and the whole brought to the loudness
target: factory/media/sound.py), muxed onto every rendition with the video stream copied."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from factory.errors import PermanentError
from factory.job import Job
from factory.media.audio import audio_argv, mux_argv
from factory.media.ffmpeg import atomic_output, ffmpeg_exe, run
from factory.media.presets import PRESETS
from factory.media.sound import Cue, make_track
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
        with (
            _sound_paths(ctx, video.audio) as (bed, cues),
            atomic_output(work / "audio.m4a") as tmp,
        ):
            duration = video.frames_total / video.fps
            audio = video.audio
            if audio is None or (not audio.cues and audio.loudness is None):
                gain, loop = (audio.gain_db, audio.loop) if audio else (0.0, True)
                run(audio_argv(ffmpeg_exe(), bed, duration, tmp, gain_db=gain, loop=loop))
            else:
                target = audio.loudness
                make_track(bed, cues, duration, tmp, work, gain_db=audio.gain_db,
                           loop=audio.loop, loudness=(target.integrated, target.true_peak)
                           if target else None)  # fmt: skip
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
        job.job_id,
        attempt=job.attempt,
        updates={"mux": {"audio": audio_key, "muxed": muxed}},
        stage=Stage.MUX,
    )
    return ctx.machine.transition(job.job_id, attempt=job.attempt, to=Stage.QC)


@contextmanager
def _sound_paths(
    ctx: StageContext, audio: AudioChoice | None
) -> Iterator[tuple[Path | None, list[Cue]]]:
    """The bed and the cues' files through the node's asset cache (fetched once, checked
    by sha256)."""
    if audio is None:
        yield None, []
        return
    if ctx.assets is None:
        raise PermanentError("no asset cache configured for this worker")
    with ExitStack() as stack:
        bed = stack.enter_context(ctx.assets.local_path(audio.asset)) if audio.asset else None
        cues = [Cue(cue.at, stack.enter_context(ctx.assets.local_path(cue.asset)), cue.gain_db)
                for cue in audio.cues]  # fmt: skip
        yield bed, cues
