"""The basic checks find real defects in real files made by ffmpeg."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from factory.generate import SegmentSpec
from factory.generate.procedural import ProceduralGenerator
from factory.manifest import parse_manifest
from factory.media.audio import audio_argv, mux_argv
from factory.media.concat import ffconcat
from factory.media.ffmpeg import ffmpeg_exe, run
from factory.media.intermediate import write_segment
from factory.media.presets import PRESETS, encode_argv
from factory.media.probe import probe
from factory.qc.basic import check_rendition

FPS, FRAMES = 12, 60
VIDEO = parse_manifest(
    f"batch: qc\nvideos:\n  - {{id: v, prompt: a lake, duration: {FRAMES / FPS}, fps: {FPS},"
    " resolution: 160x96, renditions: [mobile]}\n"
).videos[0]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("qc")
    generator = ProceduralGenerator()
    frames = generator.generate(SegmentSpec(0, FRAMES, 160, 96, FPS, 0, 0),
                                generator.encode_prompt("a lake"), None, 1)  # fmt: skip
    write_segment(folder / "seg.mkv", frames, FPS)
    (folder / "list.ffconcat").write_text(ffconcat([(folder / "seg.mkv", FRAMES)], FPS))
    run(audio_argv(ffmpeg_exe(), None, FRAMES / FPS, folder / "audio.m4a"))
    return folder


def make(source: Path, name: str, *, audio_offset: float = 0.0, **x265: str) -> Path:
    preset = replace(PRESETS["mobile"], extra_x265=x265)
    video = source / f"{name}.video.mp4"
    run(encode_argv(ffmpeg_exe(), preset, FPS, (160, 96), source / "list.ffconcat", video))
    out = source / f"{name}.mp4"
    if audio_offset:
        run([ffmpeg_exe(), "-y", "-loglevel", "error", "-i", str(video), "-itsoffset",
             str(audio_offset), "-i", str(source / "audio.m4a"), "-map", "0:v", "-map", "1:a",
             "-c", "copy", "-tag:v", "hvc1", str(out)])  # fmt: skip
    else:
        run(mux_argv(ffmpeg_exe(), video, source / "audio.m4a", out, hevc=True))
    return out


def failed_checks(path: Path) -> set[str]:
    result = check_rendition(VIDEO, "mobile", probe(path))
    return {c["name"] for c in result["checks"] if not c["passed"]}


def test_a_clean_file_passes(source: Path):
    assert failed_checks(make(source, "clean")) == set()


def test_a_five_second_gop_is_found(source: Path):
    path = make(source, "gop5", **{"keyint": "60", "min-keyint": "60"})
    assert failed_checks(path) == {"gop_seconds"}
    assert probe(path).video.max_gop_seconds == pytest.approx(5.0)


def test_an_open_gop_is_found(source: Path):
    assert failed_checks(make(source, "open", **{"open-gop": "1"})) == {"closed_gop"}


def test_an_audio_offset_of_100_ms_is_found(source: Path):
    failed = failed_checks(make(source, "late-audio", audio_offset=0.1))
    assert "av_start_offset" in failed


def test_a_truncated_file_is_found(source: Path):
    clean = make(source, "whole")
    cut = source / "cut.mp4"
    data = clean.read_bytes()
    cut.write_bytes(data[: len(data) * 2 // 3])  # faststart: the index survives, frames do not
    assert "frames" in failed_checks(cut)


def test_a_failed_check_says_why(source: Path):
    path = make(source, "gop5b", keyint="60", **{"min-keyint": "60"})
    result = check_rendition(VIDEO, "mobile", probe(path))
    assert result["passed"] is False
    [failed] = [c for c in result["checks"] if not c["passed"]]
    assert failed["name"] == "gop_seconds" and failed["value"] == 5.0 and failed["limit"] == 2
    assert failed["why"] == "keyframes 5.0 s apart; at most 2 s"
