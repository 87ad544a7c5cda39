"""ffmpeg argv is built by pure functions; these pin the exact commands."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from factory.media.audio import audio_argv, mux_argv
from factory.media.concat import concat_copy_argv, ffconcat
from factory.media.presets import PRESETS, PresetError, encode_argv, x265_params
from tests.conftest import REPO

Q = ["-hide_banner", "-nostdin", "-loglevel", "error", "-y"]


def test_encode_master_hevc_main10():
    argv = encode_argv(
        "ff", PRESETS["master"], 24, (1920, 1080), Path("/w/l.txt"), Path("/w/o.mp4")
    )
    assert argv == [
        "ff", *Q, "-f", "concat", "-safe", "0", "-i", "/w/l.txt", "-map", "0:v:0", "-an",
        "-vf", "settb=1/24,setpts=N,scale=out_color_matrix=bt709:out_range=tv,format=yuv420p10le",
        "-r", "24",
        "-c:v", "libx265", "-crf", "20", "-preset", "medium", "-pix_fmt", "yuv420p10le",
        "-profile:v", "main10",
        "-x265-params",
        "keyint=48:min-keyint=48:open-gop=0:scenecut=0:repeat-headers=1:level-idc=4.1:log-level=error",
        "-tag:v", "hvc1",
        "-colorspace", "bt709", "-color_primaries", "bt709", "-color_trc", "bt709",
        "-movflags", "+faststart", "-f", "mp4", "/w/o.mp4",
    ]  # fmt: skip


def test_encode_compat_h264_scales_down_and_closes_gops():
    argv = encode_argv("ff", PRESETS["compat"], 16, (1920, 1080), Path("/l"), Path("/o"))
    assert argv[argv.index("-vf") + 1] == (
        "settb=1/16,setpts=N,scale=1280:720:flags=lanczos,"
        "scale=out_color_matrix=bt709:out_range=tv,format=yuv420p"
    )
    start = argv.index("-c:v")
    assert argv[start : argv.index("-colorspace")] == [
        "-c:v", "libx264", "-crf", "23", "-preset", "medium", "-pix_fmt", "yuv420p",
        "-profile:v", "high", "-level:v", "4.0", "-g", "32", "-keyint_min", "32",
        "-sc_threshold", "0", "-flags", "+cgop", "-x264-params", "repeat-headers=1",
        "-tag:v", "avc1",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("preset", "source", "expected"),
    [
        ("master", (640, 360), (640, 360)),  # never upscale
        ("master", (3840, 2160), (1920, 1080)),
        ("mobile", (1920, 1080), (1280, 720)),
        ("mobile", (720, 1280), (404, 720)),  # portrait: fits the box, keeps the aspect
        ("compat", (1000, 1000), (720, 720)),
        ("compat", (642, 362), (642, 362)),
    ],
)
def test_output_size(preset: str, source: tuple[int, int], expected: tuple[int, int]):
    assert PRESETS[preset].output_size(*source) == expected


def test_unknown_x265_keys_are_refused():
    tiled = replace(PRESETS["mobile"], extra_x265={"tiles": "2"})
    with pytest.raises(PresetError, match=r"unknown x265 option.*tiles"):
        x265_params(tiled, 24)
    assert "aq-mode=3" in x265_params(replace(PRESETS["mobile"], extra_x265={"aq-mode": "3"}), 24)


def test_gop_is_two_seconds_at_any_fps():
    for fps in (12, 16, 24, 30, 60):
        assert f"keyint={2 * fps}:min-keyint={2 * fps}" in x265_params(PRESETS["master"], fps)


def test_ffconcat_carries_exact_durations_and_quotes_paths():
    text = ffconcat([(Path("/s/a.mkv"), 40), (Path("/s/it's.mkv"), 13)], 24)
    assert text == (
        "ffconcat version 1.0\n"
        "file '/s/a.mkv'\nduration 1.666666667\n"
        "file '/s/it'\\''s.mkv'\nduration 0.541666667\n"
    )


def test_concat_copy():
    assert concat_copy_argv("ff", Path("/l"), Path("/o.mp4"), hevc=True) == [
        "ff", *Q, "-f", "concat", "-safe", "0", "-i", "/l", "-map", "0:v:0", "-c", "copy",
        "-tag:v", "hvc1", "-movflags", "+faststart", "-f", "mp4", "/o.mp4",
    ]  # fmt: skip


def test_audio_loops_a_bed_to_length():
    bed = REPO / "examples" / "assets" / "calm-bed.ogg"  # opened by its bytes' one reader
    assert audio_argv("ff", bed, 12.5, Path("/o.m4a"), gain_db=-6) == [
        "ff", *Q, "-stream_loop", "-1", "-f", "ogg", "-protocol_whitelist", "file",
        "-i", str(bed),
        "-filter_complex", "[0:a]volume=-6dB[s0]", "-map", "[s0]",
        "-f", "mp4", "-b:a", "160k", "-ac", "2", "-acodec", "aac", "-ar", "48000",
        "-t", "12.500000", "/o.m4a",
    ]  # fmt: skip


def test_audio_without_loop_pads_with_silence():
    argv = audio_argv("ff", REPO / "examples" / "assets" / "calm-bed.ogg", 3, Path("/o.m4a"),
                      loop=False)  # fmt: skip
    assert "-stream_loop" not in argv
    assert argv[argv.index("-filter_complex") + 1] == "[0:a]volume=0dB[s0];[s0]apad[s1]"


def test_silence():
    argv = audio_argv("ff", None, 2, Path("/o.m4a"))
    assert argv[6:12] == ["-f", "lavfi", "-i", "anullsrc=r=48000:cl=stereo", "-map", "0:a"]


def test_mux_copies_both_streams():
    assert mux_argv("ff", Path("/v.mp4"), Path("/a.m4a"), Path("/o.mp4"), hevc=False) == [
        "ff", *Q, "-i", "/v.mp4", "-i", "/a.m4a", "-map", "0:v:0", "-map", "1:a:0",
        "-c:v", "copy", "-c:a", "copy", "-tag:v", "avc1", "-movflags", "+faststart",
        "-f", "mp4", "/o.mp4",
    ]  # fmt: skip
