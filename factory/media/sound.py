"""A video's sound track: the bed (looped or padded to length, or silence) with the cues mixed
over it at their times, sample-exact, cut at the video's end, normalised to a loudness target
(measured by ffmpeg's `ebur128`, then one linear gain, with a true-peak limiter at 4x the
sample rate only where the gain would put peaks over the ceiling, its gain raised to make up
the loudness the limiter takes off; then AAC, measured as delivered, and made again only if
the encoder moved the loudness or lifted a peak over the ceiling), and measured as delivered
(`ebur128`: integrated loudness, loudness range, true peak). Also the check that a sound file
a manifest names decodes and is within limits, before a batch is accepted.

The mix is made at 48 kHz stereo in 32-bit float (no clipping between the mix and the
normalisation) and encoded to AAC once, after normalising (docs/pipeline.md, "Sound"). Each
ffmpeg run that writes a file with a target measures it in the same run (`measured`): the
mix as it is written, the AAC as it is encoded; the gain the limiter needs is found by
probes of the float mix at its own rate (`fit_gain`), a quarter of the limiter's work at 4x.
A bed alone, with no cues and no loudness target, is made in one step
(factory/media/audio.py); with cues and no target, the mix is encoded as it is made.
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
from factory.media.identify import NotMedia, codec_problem, ffmpeg_input, open_media, reader_error
from factory.media.probe import declared_duration

MAX_SOUND_SECONDS = 1200.0  # a bed or a cue longer than this is refused at submit
MAX_SOUND_BYTES = 512 << 20
# AAC encoding can lift true peaks a little above what the limiter left: it aims this much
# under the ceiling, so the delivered file stays below it (measured: docs/qc.md, "Loudness").
TRUE_PEAK_MARGIN_DB = 0.7
LOUDNESS_TOLERANCE_LU = 1.0  # the gate's: the normaliser aims within half of it
PROBES = 4  # of the limited float mix, to find the gain that makes up what the limiter takes
MIN_SLOPE = 0.25  # LU a dB: a probe's step is at most 4x the loudness still missing
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
        with open_media(path, "sound") as container:
            if not container.streams.audio:
                return "holds no audio stream"
            stream = container.streams.audio[0]
            if problem := codec_problem(stream, "sound"):
                return problem
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
    except NotMedia as exc:
        return str(exc)
    except (av.FFmpegError, OSError, ValueError) as exc:
        return f"does not decode as audio ({reader_error(exc, path)})"
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
    aac: bool = False,
    measure: bool = False,
) -> list[str]:
    """The track before normalising, exactly ``duration`` seconds: the bed (looped, or padded
    with silence; silence without one) and each cue delayed to its first sample,
    round(at x 48000), mixed in at unit gain (no averaging). Written as 32-bit float WAV,
    48 kHz stereo, to be normalised, or with `aac` as delivered (a mix without a loudness
    target); with `measure`, measured in the same run (`measured`)."""
    samples = round(duration * SAMPLE_RATE)
    inputs: list[str] = []
    if bed is None:
        inputs += ["-f", "lavfi", "-i", f"anullsrc=r={SAMPLE_RATE}:cl=stereo"]
    else:
        inputs += ffmpeg_input(bed, "sound", loop=loop)
    for cue in cues:
        inputs += ffmpeg_input(cue.path, "sound")
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
    body = [*inputs, "-filter_complex", ";".join(graph), "-map", "[mix]",
            *(_aac(output) if aac else _float_wav(output))]  # fmt: skip
    return measured(exe, body) if measure else [exe, *QUIET, *body]


def measured(exe: str, body: Sequence[str]) -> list[str]:
    """An ffmpeg command writing one audio stream (``body``: its inputs, filters and output)
    that also measures what it writes, as written: the encoded stream decoded again on the
    way out (a loopback decoder, `-dec`) into `ebur128` (integrated loudness, loudness
    range, true peak at 4x), on threads of their own, beside the filters and the encoder.
    Read its printout with `summary`: one run makes and measures a file."""
    return [
        exe, "-hide_banner", "-nostdin", "-nostats", "-y", *body,  # (info: the summary)
        "-dec", "0:0", "-filter_complex", "[dec:0]ebur128=peak=true:framelog=quiet[loudness]",
        "-map", "[loudness]", "-f", "null", "-",
    ]  # fmt: skip


def measure_loudness(path: Path) -> LoudnessMeasure:
    """Integrated loudness, loudness range and true peak of a file's first audio stream, by
    ffmpeg's `ebur128` (EBU R128 / ITU-R BS.1770; true peak by 4x oversampling), with its
    short-term loudness every 100 ms."""
    argv = [ffmpeg_exe(), "-hide_banner", "-nostats", "-i", str(path), "-map", "0:a:0",
            "-af", "ebur128=peak=true:framelog=info", "-f", "null", "-"]  # fmt: skip
    return summary(argv, run_output(argv))


def summary(argv: Sequence[str], text: str) -> LoudnessMeasure:
    """What `ebur128` printed (its summary; its frame log, where it printed one, as the
    short-term loudness) when `argv` ran."""
    tail = text[text.rfind("Summary:") :]
    short_term = tuple(
        (float(t), _level(level)) for t, level in _FRAME_LOG.findall(text[: len(text) - len(tail)])
    )
    found = {
        name: re.search(pattern, tail)
        for name, pattern in (
            ("integrated", _INTEGRATED),
            ("range", r"LRA:\s+(-?[\d.]+) LU"),
            ("true_peak", r"Peak:\s+(-?[\d.]+|-inf) dBFS"),
        )
    }
    if not tail or any(match is None for match in found.values()):
        raise MediaError(argv, 0, f"ebur128 printed no summary: {text[-400:]}")
    values = {k: _level(m.group(1)) for k, m in found.items() if m is not None}
    return LoudnessMeasure(values["integrated"], values["range"], values["true_peak"], short_term)


_FRAME_LOG = re.compile(r"t:\s*([\d.]+)\s.*?S:\s*(-?[\d.]+|-inf)")
_INTEGRATED = r"I:\s+(-?[\d.]+|-inf) LUFS"


def _limiter(ceiling: float, *, oversample: int) -> str:
    """`alimiter` capping the true peak at `ceiling` (dBTP), run at `oversample` x the sample
    rate (where inter-sample peaks are seen), its lookahead's delay taken back out (the track
    stays on its samples: the cues where they were mixed)."""
    limit = 10 ** (ceiling / 20)
    chain = f"alimiter=limit={limit:.6f}:attack=1:release=50:level=false:latency=1"
    if oversample == 1:
        return chain
    return f"aresample={SAMPLE_RATE * oversample},{chain},aresample={SAMPLE_RATE}"


def normalise_argv(exe: str, source: Path, output: Path, *, gain_db: float,
                   ceiling: float | None) -> list[str]:  # fmt: skip
    """The mix brought up or down by `gain_db` (a linear gain: the mix's dynamics are kept)
    and, where that would put its true peak over `ceiling` (dBTP), limited at 4x the
    sample rate; encoded to AAC, as delivered, and measured as delivered in the same run."""
    chain = f"volume={gain_db:.3f}dB"
    if ceiling is not None:
        chain += f",{_limiter(ceiling, oversample=4)}"
    return measured(exe, ["-i", str(source), "-map", "0:a:0", "-af", chain, *_aac(output)])


def probe_argv(exe: str, source: Path, *, gain_db: float, ceiling: float) -> list[str]:
    """The integrated loudness `normalise_argv` would give the float mix with a limiter,
    nothing written: the limiter at the mix's own rate, a quarter of the work, takes the
    same loudness off as at 4x (within 0.1 LU, the figure's precision), and no true peak
    is measured (the limiter sets it)."""
    chain = f"volume={gain_db:.3f}dB,{_limiter(ceiling, oversample=1)},ebur128=framelog=quiet"
    return [exe, "-hide_banner", "-nostdin", "-nostats", "-i", str(source), "-map", "0:a:0",
            "-af", chain, "-f", "null", "-"]  # fmt: skip


def _aac(output: Path) -> list[str]:
    return ["-c:a", "aac", "-b:a", BITRATE, "-ar", str(SAMPLE_RATE), "-ac", "2", "-f", "mp4",
            str(output)]  # fmt: skip


def _float_wav(output: Path) -> list[str]:
    return ["-c:a", "pcm_f32le", "-ar", str(SAMPLE_RATE), "-ac", "2", "-f", "wav", str(output)]


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
    (integrated LUFS, true-peak ceiling dBTP) when given.

    Each ffmpeg run measures what it writes (`measured`): the mix, written as float WAV,
    then the AAC, made from it in one run (gain, limiter where needed, encoder) and
    measured as delivered. Where the limiter is needed, the gain that makes up for the
    loudness it takes off is found first by cheap probes of the float mix (`fit_gain`);
    AAC is encoded again only where it moved the loudness or a peak past the tolerance."""
    exe = ffmpeg_exe()
    if loudness is None:
        run(mix_argv(exe, bed, cues, duration, output, gain_db=gain_db, loop=loop, aac=True))
        return
    integrated, ceiling = loudness
    mix = scratch / "mix.wav"
    argv = mix_argv(exe, bed, cues, duration, mix, gain_db=gain_db, loop=loop, measure=True)
    before = summary(argv, run_output(argv))
    if before.integrated <= SILENCE_LUFS:
        raise PermanentError(
            "audio.loudness: the mixed track is silent, so it cannot be brought to a loudness; "
            "check the bed and cues, or leave loudness out"
        )
    aim = ceiling - TRUE_PEAK_MARGIN_DB
    want = integrated  # for the float mix: moved by what AAC moves
    gain = want - before.integrated
    for _ in range(AAC_PASSES):
        limited = before.true_peak + gain > aim  # (a linear gain moves the peak with it)
        if limited:
            gain = fit_gain(mix, want, aim, gain)
        argv = normalise_argv(exe, mix, output, gain_db=gain, ceiling=aim if limited else None)
        delivered = summary(argv, run_output(argv))
        off, over = integrated - delivered.integrated, delivered.true_peak - ceiling
        if abs(off) <= LOUDNESS_TOLERANCE_LU / 2 and over <= 0:
            return
        # AAC moved it: its low-pass takes off loudness where a mix has much energy above
        # 15 kHz (K-weighting counts that part more), and it may lift a peak. Aim the float
        # mix off by as much, limit lower by the overshoot, encode again.
        if over > 0:  # (the float mix's true peak was the lower of the two)
            aim = min(aim, before.true_peak + gain) - over - 0.2
        want, gain = want + off, gain + off
    # (What still misses is the quality gate's to fail, with its figures.)


def fit_gain(mix: Path, want: float, ceiling: float, gain: float) -> float:
    """The gain that brings the float `mix`, limited at `ceiling` (dBTP), to `want` LUFS,
    from `gain` (which would without the limiter): the limiter takes loudness off the peaks,
    the more the higher the gain, so each probe (`probe_argv`) steps by the loudness still
    missing over how much the last step moved it (a secant; at first 1 LU a dB)."""
    last: tuple[float, float] | None = None
    for _ in range(PROBES):
        argv = probe_argv(ffmpeg_exe(), mix, gain_db=gain, ceiling=ceiling)
        text = run_output(argv)
        found = re.search(_INTEGRATED, text[text.rfind("Summary:") :])
        if found is None:
            raise MediaError(argv, 0, f"ebur128 printed no summary: {text[-400:]}")
        level = _level(found.group(1))
        off = want - level
        if abs(off) <= LOUDNESS_TOLERANCE_LU / 4:
            break
        slope = 1.0
        if last is not None and gain != last[0]:
            slope = min(max((level - last[1]) / (gain - last[0]), MIN_SLOPE), 1.0)
        last = (gain, level)
        gain += off / slope
    return gain


def _level(text: str) -> float:
    return -70.0 if text == "-inf" else max(float(text), -70.0)
