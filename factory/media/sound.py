"""A video's sound track: the bed (looped or padded to length, or silence) with the cues mixed
over it at their times, sample-exact, cut at the video's end, normalised to a loudness target
in two passes (measured by ffmpeg's `ebur128`, then one linear gain, with a true-peak limiter
at 4x the sample rate only where the gain would put peaks over the ceiling, and corrections
where the limiter took loudness off, all on the float mix; then AAC, measured, and limited
lower once more if the encoder lifted a peak over the ceiling), and measured as delivered
(`ebur128`: integrated loudness, loudness range, true peak). Also the check that a sound file
a manifest names decodes and is within limits, before a batch is accepted.

The mix is made at 48 kHz stereo in 32-bit float (no clipping between the mix and the
normalisation) and encoded to AAC once, after normalising (docs/pipeline.md, "Sound"). A bed
alone, with no cues and no loudness target, is made in one step (factory/media/audio.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import av

from factory.errors import MediaError, PermanentError
from factory.media.audio import BITRATE, SAMPLE_RATE
from factory.media.ffmpeg import QUIET, ffmpeg_exe, run, run_output
from factory.media.probe import declared_duration

MAX_SOUND_SECONDS = 1200.0  # a bed or a cue longer than this is refused at submit
MAX_SOUND_BYTES = 512 << 20
# AAC encoding can lift true peaks a little above what the limiter left: it aims this much
# under the ceiling, so the delivered file stays below it (measured: docs/qc.md, "Loudness").
TRUE_PEAK_MARGIN_DB = 0.7
LOUDNESS_TOLERANCE_LU = 1.0  # the gate's: the normaliser aims within half of it
NORMALISE_PASSES = 4  # gain, then corrections where the limiter took loudness off
AAC_PASSES = 3  # encodes, corrected where AAC moved the loudness or a peak
SILENCE_LUFS = -70.0  # BS.1770's absolute gate: nothing louder was measured


@dataclass(frozen=True)
class Cue:
    at: float  # seconds
    path: Path
    gain_db: float = 0.0


@dataclass(frozen=True)
class LoudnessMeasure:
    integrated: float  # LUFS (-70 for silence: the absolute gate)
    range: float  # LU (loudness range, LRA)
    true_peak: float  # dBTP
    # Short-term loudness (3 s windows) every 100 ms: (seconds, LUFS), for the plot.
    short_term: tuple[tuple[float, float], ...] = ()


def check_sound_file(path: Path) -> str | None:
    """Why a bed or cue file cannot be used (not audio, undecodable, too long or too large),
    or None when it can: its first second is decoded, and its declared length read."""
    size = path.stat().st_size
    if size > MAX_SOUND_BYTES:
        return f"is {size >> 20} MiB; at most {MAX_SOUND_BYTES >> 20} MiB"
    try:
        with av.open(str(path)) as container:
            if not container.streams.audio:
                return "holds no audio stream"
            stream = container.streams.audio[0]
            seconds = declared_duration(container, stream)
            if seconds is not None and seconds > MAX_SOUND_SECONDS:
                return f"is {seconds:.0f} s long; at most {MAX_SOUND_SECONDS:.0f} s"
            decoded = 0.0
            for frame in container.decode(stream):
                decoded += frame.samples / max(frame.sample_rate, 1)
                if decoded >= 1.0:
                    break
            if decoded <= 0:
                return "decodes to no sound"
    except (av.FFmpegError, OSError, ValueError) as exc:
        return f"does not decode as audio ({str(exc)[:200]})"
    return None


def mix_argv(
    exe: str,
    bed: Path | None,
    cues: Sequence[Cue],
    duration: float,
    output: Path,
    *,
    gain_db: float = 0.0,
    loop: bool = True,
) -> list[str]:
    """The track before normalising: 32-bit float WAV, 48 kHz stereo, exactly ``duration``
    seconds: the bed (looped, or padded with silence; silence without one) and each cue
    delayed to its first sample, round(at x 48000), mixed in at unit gain (no averaging)."""
    samples = round(duration * SAMPLE_RATE)
    inputs: list[str] = []
    if bed is None:
        inputs += ["-f", "lavfi", "-i", f"anullsrc=r={SAMPLE_RATE}:cl=stereo"]
    else:
        inputs += [*(["-stream_loop", "-1"] if loop else []), "-i", str(bed)]
    for cue in cues:
        inputs += ["-i", str(cue.path)]
    common = f"aresample={SAMPLE_RATE},aformat=sample_fmts=fltp:channel_layouts=stereo"
    graph = [f"[0:a]{common},volume={gain_db:g}dB,apad[bed]"]
    names = ["[bed]"]
    for k, cue in enumerate(cues, start=1):
        delay = round(cue.at * SAMPLE_RATE)
        graph.append(f"[{k}:a]{common},volume={cue.gain_db:g}dB,adelay={delay}S:all=1[c{k}]")
        names.append(f"[c{k}]")
    if cues:
        graph.append(f"{''.join(names)}amix=inputs={len(names)}:duration=first:normalize=0,"
                     f"atrim=end_sample={samples}[mix]")  # fmt: skip
    else:
        graph.append(f"[bed]atrim=end_sample={samples}[mix]")
    return [
        exe, *QUIET, *inputs, "-filter_complex", ";".join(graph), "-map", "[mix]",
        "-c:a", "pcm_f32le", "-ar", str(SAMPLE_RATE), "-ac", "2", "-f", "wav", str(output),
    ]  # fmt: skip


def measure_loudness(path: Path) -> LoudnessMeasure:
    """Integrated loudness, loudness range and true peak of a file's first audio stream, by
    ffmpeg's `ebur128` (EBU R128 / ITU-R BS.1770; true peak by 4x oversampling)."""
    argv = [ffmpeg_exe(), "-hide_banner", "-nostats", "-i", str(path), "-map", "0:a:0",
            "-af", "ebur128=peak=true:framelog=info", "-f", "null", "-"]  # fmt: skip
    text = run_output(argv)
    summary = text[text.rfind("Summary:") :]
    short_term = tuple(
        (float(t), _level(level))
        for t, level in _FRAME_LOG.findall(text[: len(text) - len(summary)])
    )
    found = {
        name: re.search(pattern, summary)
        for name, pattern in (
            ("integrated", r"I:\s+(-?[\d.]+|-inf) LUFS"),
            ("range", r"LRA:\s+(-?[\d.]+) LU"),
            ("true_peak", r"Peak:\s+(-?[\d.]+|-inf) dBFS"),
        )
    }
    if not summary or any(match is None for match in found.values()):
        raise MediaError(argv, 0, f"ebur128 printed no summary: {text[-400:]}")
    values = {k: _level(m.group(1)) for k, m in found.items() if m is not None}
    return LoudnessMeasure(values["integrated"], values["range"], values["true_peak"], short_term)


_FRAME_LOG = re.compile(r"t:\s*([\d.]+)\s.*?S:\s*(-?[\d.]+|-inf)")


def normalise_argv(exe: str, source: Path, output: Path, *, gain_db: float,
                   ceiling: float | None) -> list[str]:  # fmt: skip
    """The mix brought up or down by `gain_db` (a linear gain: the mix's dynamics are kept)
    and, where that would put its true peak over `ceiling` (dBTP), limited at 4x the
    sample rate (where true peaks are seen); written as the mix is (float WAV)."""
    chain = f"volume={gain_db:.3f}dB"
    if ceiling is not None:
        limit = 10 ** (ceiling / 20)
        chain += (f",aresample={SAMPLE_RATE * 4},alimiter=limit={limit:.6f}:attack=1"
                  f":release=50:level=false,aresample={SAMPLE_RATE}")  # fmt: skip
    return [exe, *QUIET, "-i", str(source), "-af", chain, "-c:a", "pcm_f32le",
            "-ar", str(SAMPLE_RATE), "-ac", "2", "-f", "wav", str(output)]  # fmt: skip


def encode_argv(exe: str, source: Path, output: Path) -> list[str]:
    """The mix as it is (no loudness target), AAC."""
    return [exe, *QUIET, "-i", str(source), *_aac(output)]


def _aac(output: Path) -> list[str]:
    return ["-c:a", "aac", "-b:a", BITRATE, "-ar", str(SAMPLE_RATE), "-ac", "2", "-f", "mp4",
            str(output)]  # fmt: skip


def make_track(
    bed: Path | None,
    cues: Sequence[Cue],
    duration: float,
    output: Path,
    scratch: Path,
    *,
    gain_db: float = 0.0,
    loop: bool = True,
    loudness: tuple[float, float] | None = None,
) -> None:
    """The AAC track of exactly ``duration`` seconds: mixed, then normalised to ``loudness``
    (integrated LUFS, true-peak ceiling dBTP) when given."""
    mix = scratch / "mix.wav"
    run(mix_argv(ffmpeg_exe(), bed, cues, duration, mix, gain_db=gain_db, loop=loop))
    if loudness is None:
        run(encode_argv(ffmpeg_exe(), mix, output))
        return
    integrated, ceiling = loudness
    before = measure_loudness(mix)
    if before.integrated <= SILENCE_LUFS:
        raise PermanentError(
            "audio.loudness: the mixed track is silent, so it cannot be brought to a loudness; "
            "check the bed and cues, or leave loudness out"
        )
    aim = ceiling - TRUE_PEAK_MARGIN_DB
    gain = integrated - before.integrated
    limited = before.true_peak + gain > aim
    shaped = scratch / "shaped.wav"
    for _ in range(NORMALISE_PASSES):
        # On the float WAV, which is quick to make and to measure; AAC once it meets them.
        run(normalise_argv(ffmpeg_exe(), mix, shaped, gain_db=gain,
                           ceiling=aim if limited else None))  # fmt: skip
        after = measure_loudness(shaped)
        off = integrated - after.integrated
        if abs(off) <= LOUDNESS_TOLERANCE_LU / 4 and after.true_peak <= aim + 0.1:
            break
        gain += off  # the limiter took loudness off the peaks: make it up
        limited = limited or after.true_peak > aim
    for _ in range(AAC_PASSES):
        run(encode_argv(ffmpeg_exe(), shaped, output))
        delivered = measure_loudness(output)
        off, over = integrated - delivered.integrated, delivered.true_peak - ceiling
        if abs(off) <= LOUDNESS_TOLERANCE_LU / 2 and over <= 0:
            return
        # AAC moved it: its low-pass takes off loudness where a mix has much energy above
        # 15 kHz (K-weighting counts that part more), and it may lift a peak. Correct the
        # gain, limit lower by the overshoot, encode again.
        gain += off
        if over > 0:
            aim, limited = aim - over - 0.2, True
        run(normalise_argv(ffmpeg_exe(), mix, shaped, gain_db=gain,
                           ceiling=aim if limited else None))  # fmt: skip
    # (What still misses is the quality gate's to fail, with its figures.)


def _level(text: str) -> float:
    return -70.0 if text == "-inf" else max(float(text), -70.0)
