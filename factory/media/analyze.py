"""The quality gate's one pass over a video with ffmpeg: decode every frame, count decode
errors per input, find black and frozen runs, and (given a reference) compute per-frame
PSNR, SSIM and VMAF of every rendition at once, the reference decoded once and shared.

Frames are paired by index, never by timestamp: both inputs are renumbered
(`settb=1/FPS,setpts=N`), because an MP4 (timebase 1/12288) against an FFV1 MKV (ms
timestamps) otherwise pairs the wrong frames (../shared/reference/VIDEO_NOTES.md).
With libvmaf the fidelity numbers are libvmaf's (psnr_y, float_ssim, vmaf v0.6.1); an ffmpeg
without libvmaf gets PSNR and SSIM from the psnr/ssim filters and VMAF as unavailable.

Measuring every Nth frame (`subsample`): the renditions are still decoded in full (they are
inter-coded, and the decode check and the detectors see every frame), then decimated; the
lossless reference is intra-only, so only every Nth frame of it is decoded at all (in
process, fed to ffmpeg through a pipe). That is where the time goes: a noisy 720p FFV1
intermediate decodes at ~30 frames/s here, slower than all three renditions together.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import numpy as np

from factory.media.ffmpeg import STDERR_TAIL, ffmpeg_exe, has_filter
from factory.media.frames import INTRA_ONLY

BLACK_PIXEL = 0.10  # a pixel is black below 10% of the luma range
BLACK_PICTURE = 0.98  # a picture is black when 98% of its pixels are
FREEZE_NOISE_DB = -60  # frames closer than this count as the same (ffmpeg's default)
MIN_RUN = 0.1  # seconds: shorter black or frozen runs are not reported at all


@dataclass
class Reference:
    """The frames renditions were made from: files in order, each with how many of its frames
    count (None: all), and the size they are compared at."""

    files: list[tuple[Path, int | None]]
    width: int
    height: int


@dataclass
class PassResult:
    decoded_ok: bool
    decode_error: str
    frames: int | None
    black: list[tuple[float, float]]
    frozen: list[tuple[float, float]]
    per_frame: dict[str, list[float]] = field(default_factory=dict)  # psnr_y, ssim, vmaf, frame
    vmaf_available: bool = False
    fidelity_source: str = ""  # "libvmaf" or "psnr/ssim filters"


def _reference_frames(reference: Reference, every: int) -> Iterator[np.ndarray]:
    """Every `every`th frame of the reference files (intra-only: the others are not decoded)."""
    index = 0
    for path, count in reference.files:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            intra = stream.codec_context.name in INTRA_ONLY
            taken = 0
            for packet in container.demux(stream):
                if packet.size == 0:
                    continue
                if count is not None and taken >= count:
                    break
                wanted = index % every == 0
                if wanted or not intra:
                    for frame in packet.decode():
                        if wanted:
                            yield frame.to_ndarray(format="rgb24")
                index += 1
                taken += 1


def _feed(proc: subprocess.Popen, frames: Iterator[np.ndarray], failures: list[str]) -> None:
    assert proc.stdin is not None
    try:
        for frame in frames:
            proc.stdin.write(np.ascontiguousarray(frame).tobytes())
    except BrokenPipeError:
        pass  # ffmpeg stopped early; its own log says why
    except Exception as error:  # the reference itself is broken
        failures.append(f"reference: {type(error).__name__}: {error}")
    finally:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()


def _reference_input(
    reference: Reference, fps: float, renumber: str, count: int
) -> tuple[list[str], str]:
    """The reference as raw frames on stdin: its input options, and the graph that renumbers,
    converts and splits it once into a copy per source (`[ref0]`, `[ref1]`, ...)."""
    options = [
        "-f",
        "rawvideo",
        "-pix_fmt",
        "rgb24",
        "-s",
        f"{reference.width}x{reference.height}",
        "-r",
        f"{fps:g}",
        "-i",
        "pipe:0",
    ]
    split = "".join(f"[ref{i}]" for i in range(count))
    graph = (
        f"[{count}:v]{renumber},scale=out_color_matrix=bt709:out_range=tv,"
        f"format=yuv420p,split={count}{split}"
    )
    return options, graph


def _fidelity_graph(i: int, work: Path, vmaf: bool) -> tuple[str, list[str]]:
    """Source `i` against its copy of the reference: libvmaf with its JSON log, or the psnr
    and ssim filters with their stats files; the graph, and the extra outputs it needs."""
    if vmaf:
        log = work / f"vmaf-{i}.json"
        graph = (
            f"[main{i}][ref{i}]libvmaf=log_fmt=json:log_path={log}:n_threads=2:"
            f"feature=name=psnr|name=float_ssim[out{i}]"
        )
        return graph, []
    graph = (
        f"[main{i}]split[m{i}a][m{i}b];[ref{i}]split[r{i}a][r{i}b];"
        f"[m{i}a][r{i}a]psnr=stats_file={work / f'psnr-{i}.log'}[out{i}];"
        f"[m{i}b][r{i}b]ssim=stats_file={work / f'ssim-{i}.log'}[s{i}]"
    )
    return graph, ["-map", f"[s{i}]", "-f", "null", "-"]


def quality_argv(
    sources: dict[str, Path],
    fps: float,
    *,
    reference: Reference | None,
    work: Path,
    vmaf: bool,
    subsample: int = 1,
    content_on: str | None = None,
) -> list[str]:
    """One ffmpeg run over every source and the reference (raw frames on stdin, every
    `subsample`th one): decode statistics per input at `-v verbose`, black/frozen detection
    on `content_on`, and the fidelity of each source against the shared reference."""
    exe = ffmpeg_exe()
    names = list(sources)
    content_on = content_on or names[0]
    renumber = f"settb=1/{fps:g},setpts=N"
    content = (
        f"blackdetect=d={MIN_RUN}:pic_th={BLACK_PICTURE}:pix_th={BLACK_PIXEL},"
        f"freezedetect=n={FREEZE_NOISE_DB}dB:d={MIN_RUN}"
    )
    argv = [exe, "-hide_banner", "-nostdin", "-y", "-v", "verbose", "-err_detect", "explode"]
    for name in names:
        argv += ["-i", str(sources[name])]
    graph = []
    if reference is not None:
        argv = [a for a in argv if a != "-nostdin"]
        options, split = _reference_input(reference, fps, renumber, len(names))
        argv += options
        graph.append(split)
    outputs = []
    decimate = f",select=not(mod(n\\,{subsample})),{renumber}" if subsample > 1 else ""
    for i, name in enumerate(names):
        chain = f"[{i}:v]{renumber}" + (f",{content}" if name == content_on else "")
        if reference is None:
            graph.append(f"{chain}[out{i}]")
        else:
            size = f"scale={reference.width}:{reference.height}:flags=bicubic"
            graph.append(f"{chain}{decimate},{size},format=yuv420p[main{i}]")
            fidelity, extra = _fidelity_graph(i, work, vmaf)
            graph.append(fidelity)
            outputs += extra
        outputs += ["-map", f"[out{i}]", "-f", "null", "-"]
    return [*argv, "-filter_complex", ";".join(graph), *outputs]


def _run_pass(
    argv: list[str], reference: Reference | None, subsample: int, timeout: float | None
) -> tuple[str, int]:
    """Run ffmpeg, feeding it the reference's frames from a thread; gives its log and exit
    status, or raises ValueError when the reference itself could not be read."""
    failures: list[str] = []
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE if reference else subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    feeder = None
    if reference is not None:
        frames = _reference_frames(reference, subsample)
        feeder = threading.Thread(target=_feed, args=(proc, frames, failures), daemon=True)
        feeder.start()
    try:
        assert proc.stderr is not None
        log = proc.stderr.read().decode(errors="replace")
        returncode = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
        if feeder is not None:
            feeder.join(timeout=30)
    if failures:
        raise ValueError("; ".join(failures))
    return log, returncode


def _read_fidelity(result: PassResult, i: int, work: Path, vmaf: bool, subsample: int) -> None:
    """Fill in source `i`'s per-frame fidelity from libvmaf's log or the filters' stats."""
    if vmaf:
        data = json.loads((work / f"vmaf-{i}.json").read_text())
        result.per_frame = parse_vmaf_log(data, subsample)
        result.vmaf_available, result.fidelity_source = True, "libvmaf"
    else:
        result.per_frame = {
            "psnr_y": parse_stats(work / f"psnr-{i}.log", "psnr_y"),
            "ssim": parse_stats(work / f"ssim-{i}.log", "Y"),
        }
        count = len(result.per_frame["psnr_y"])
        result.per_frame["frame"] = [float(n * subsample) for n in range(count)]
        result.fidelity_source = "psnr/ssim filters"


def analyze(
    sources: dict[str, Path],
    fps: float,
    duration: float | None,
    *,
    reference: Reference | None,
    work: Path,
    subsample: int = 1,
    use_vmaf: bool | None = None,
    content_on: str | None = None,
    timeout: float | None = None,
) -> dict[str, PassResult]:
    """Run the pass; `duration` closes a frozen run that lasts to the end of the video. Black
    and frozen runs are found on `content_on` (default: the first source) only."""
    vmaf = has_filter("libvmaf") if use_vmaf is None else use_vmaf
    work.mkdir(parents=True, exist_ok=True)
    names = list(sources)
    content_on = content_on or names[0]
    subsample = max(1, subsample)
    argv = quality_argv(
        sources,
        fps,
        reference=reference,
        work=work,
        vmaf=vmaf,
        subsample=subsample,
        content_on=content_on,
    )
    log, returncode = _run_pass(argv, reference, subsample, timeout)
    stats = input_stats(log)
    results = {}
    for i, name in enumerate(names):
        decoded, errors = stats.get(i, (None, None))
        ok = returncode == 0 and errors == 0
        result = PassResult(
            decoded_ok=ok,
            decode_error="" if ok else _problem(log, errors),
            frames=decoded,
            black=black_runs(log) if name == content_on else [],
            frozen=frozen_runs(log, duration) if name == content_on else [],
        )
        if reference is not None and returncode == 0:
            _read_fidelity(result, i, work, vmaf, subsample)
        results[name] = result
    return results


_ERROR_LINE = re.compile(r"error|invalid|corrupt|truncat|missing|non-existing", re.IGNORECASE)
_NOISE = re.compile(r"^(frame=|size=|\s*Stream|\s*Metadata|\s*Duration|Input|Output|Press)")


def decode_errors(log: str) -> list[str]:
    """Lines where the decoder or demuxer complained (a clean decode prints none)."""
    found = []
    for line in log.splitlines():
        if (
            _NOISE.match(line)
            or " decode errors" in line
            or any(
                mark in line
                for mark in ("[Parsed_", "[null @", "[out#", "[fc#", "[vost#", "[vist#")
            )
        ):
            continue
        if _ERROR_LINE.search(line):
            found.append(line.strip())
    return found[:20]


def black_runs(log: str) -> list[tuple[float, float]]:
    runs = re.findall(r"black_start:\s*([\d.]+)\s+black_end:\s*([\d.]+)", log)
    return [(float(a), float(b)) for a, b in runs]


def frozen_runs(log: str, duration: float | None) -> list[tuple[float, float]]:
    """freezedetect logs a start and (if the freeze ends) an end; one that runs to the end of
    the video logs only its start: it lasts to the end."""
    runs: list[tuple[float, float]] = []
    start: float | None = None
    for kind, value in re.findall(r"lavfi\.freezedetect\.freeze_(start|end):\s*([\d.]+)", log):
        if kind == "start":
            start = float(value)
        elif start is not None:
            runs.append((start, float(value)))
            start = None
    if start is not None:
        runs.append((start, float(duration) if duration is not None else start))
    return runs


def parse_vmaf_log(data: dict[str, Any], every: int = 1) -> dict[str, list[float]]:
    """Per-frame series; `frame` is the index in the full video (the log counts measured
    frames only)."""
    frames = data.get("frames", [])
    series: dict[str, list[float]] = {"frame": [], "psnr_y": [], "ssim": [], "vmaf": []}
    for entry in frames:
        metrics = entry["metrics"]
        series["frame"].append(float(entry["frameNum"] * every))
        series["psnr_y"].append(float(metrics["psnr_y"]))
        series["ssim"].append(float(metrics["float_ssim"]))
        series["vmaf"].append(float(metrics["vmaf"]))
    return series


def parse_stats(path: Path, key: str) -> list[float]:
    values = []
    for line in path.read_text().splitlines():
        match = re.search(rf"\b{key}:(\S+)", line)
        if match:
            raw = match.group(1)
            values.append(float("inf") if raw == "inf" else float(raw))
    return values


_INPUT_STATS = re.compile(
    r"Input stream #(\d+):\d+ \(video\): \d+ packets read \(\d+ bytes\); "
    r"(\d+) frames decoded; (\d+) decode errors"
)


def input_stats(log: str) -> dict[int, tuple[int, int]]:
    """{input index: (frames decoded, decode errors)} from ffmpeg's verbose summary."""
    return {int(i): (int(f), int(e)) for i, f, e in _INPUT_STATS.findall(log)}


def _problem(log: str, errors: int | None) -> str:
    if errors:
        return f"{errors} frame(s) failed to decode; " + "; ".join(decode_errors(log)[:3])
    lines = decode_errors(log) or [log.strip()[-STDERR_TAIL:]]
    return "; ".join(lines[:3])
