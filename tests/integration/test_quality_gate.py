"""The quality gate on real camera footage and on its own output: clean videos pass; every
injected defect (a colour jump at a seam, a frozen segment, black frames, a 100 ms A/V
offset, a 5 s GOP, a truncated file) is found with the right reason; `factory qc` exits
0 / 3 / 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from factory.media.analyze import Reference, analyze
from factory.qc import gate
from tests import footage
from tests.conftest import run_cli_here
from tests.integration.test_pipeline import home_env


@pytest.fixture(scope="module")
def bikes(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("bikes")
    frames, fps = footage.decode(footage.bikes())
    return {
        "folder": folder,
        "frames": frames,
        "fps": fps,
        "reference": footage.lossless(frames, fps, folder / "reference.mkv"),
        "clean": footage.deliverable(frames, fps, folder, "clean"),
    }


def qc(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    done = run_cli_here("qc", *args, "--json", env=env or {}, timeout=300)
    assert done.returncode in (0, 3), done.stderr
    return done.returncode, json.loads(done.stdout)


def failed(document: dict) -> dict[str, str]:
    return {f["check"]: f["why"] for f in document["failures"]}


def test_clean_real_footage_passes_with_its_fidelity_reported(bikes: dict, tmp_path: Path):
    code, document = qc(
        str(bikes["clean"]),
        "--reference",
        str(bikes["reference"]),
        "--seams",
        "4.0,7.0",
        "--out",
        str(tmp_path),
    )
    assert code == 0, document["failures"]
    fidelity = document["renditions"]["video"]["fidelity"]
    assert fidelity["source"] == "libvmaf" and fidelity["vmaf_available"] is True
    assert fidelity["psnr_y"]["mean"] >= 38 and fidelity["vmaf"]["mean"] >= 82
    # Measured on every 4th frame by default (FACTORY_QC_VMAF_SUBSAMPLE), paired by index.
    assert fidelity["subsample"] == 4 and fidelity["psnr_y"]["frames"] == 63  # of 250
    assert [s["passed"] for s in document["seams"]] == [True, True]
    assert document["schema"] == "factory.qc/2"
    for picture in ("contact.png", "quality.png"):
        assert (tmp_path / picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_second_real_clip_passes(tmp_path: Path):
    frames, fps = footage.decode(footage.city())
    clean = footage.deliverable(frames, fps, tmp_path, "city")
    reference = footage.lossless(frames, fps, tmp_path / "city-reference.mkv")
    code, document = qc(str(clean), "--reference", str(reference))
    assert code == 0, document["failures"]


def test_a_colour_jump_at_a_seam_is_found(bikes: dict):
    frames = bikes["frames"].astype(np.int16)
    frames[125:, ..., 0] += 40  # from 5 s on, the red channel jumps
    jumped = footage.deliverable(
        np.clip(frames, 0, 255).astype(np.uint8), bikes["fps"], bikes["folder"], "jump"
    )
    code, document = qc(str(jumped), "--seams", "3.0,5.0")
    assert code == 3
    why = failed(document)
    assert set(why) == {"seams.seam_2"} and "colour shift" in why["seams.seam_2"]
    assert "5.00 s" in why["seams.seam_2"]
    assert document["drift"][0]["judged"] is False  # reported for any file, judged in a job


def test_a_frozen_segment_is_found(bikes: dict):
    frames = bikes["frames"].copy()
    frames[100:175] = frames[100]  # 3 s of one picture
    frozen = footage.deliverable(frames, bikes["fps"], bikes["folder"], "frozen")
    code, document = qc(str(frozen))
    assert code == 3
    why = failed(document)
    assert set(why) == {"video.frozen_frames"} and "4.0" in why["video.frozen_frames"]


def test_a_freeze_that_runs_to_the_end_lasts_to_the_end(bikes: dict):
    frames = bikes["frames"].copy()
    frames[200:] = frames[200]
    frozen = footage.deliverable(frames, bikes["fps"], bikes["folder"], "frozen-end")
    code, document = qc(str(frozen))
    assert code == 3
    [[start, end]] = [
        r for r in document["renditions"]["video"]["content"]["frozen"] if r[1] - r[0] >= 1
    ]
    assert start == pytest.approx(8.0, abs=0.1) and end == pytest.approx(10.0, abs=0.05)


def test_black_frames_are_found(bikes: dict):
    frames = bikes["frames"].copy()
    frames[50:75] = 0  # 1 s of black
    black = footage.deliverable(frames, bikes["fps"], bikes["folder"], "black")
    code, document = qc(str(black))
    assert code == 3
    why = failed(document)
    assert "video.black_frames" in why and "2.00" in why["video.black_frames"]


def test_an_audio_offset_of_100_ms_is_found(bikes: dict):
    late = footage.deliverable(
        bikes["frames"], bikes["fps"], bikes["folder"], "late", audio_offset=0.1
    )
    code, document = qc(str(late))
    assert code == 3 and "video.av_start_offset" in failed(document)
    offset = next(
        c for c in document["renditions"]["video"]["checks"] if c["name"] == "av_start_offset"
    )["value"]
    # 100 ms shifted; the container reports it less the AAC encoder's priming (~21 ms).
    assert -0.110 <= offset <= -0.070


def test_a_five_second_gop_is_found(bikes: dict):
    gop = footage.deliverable(bikes["frames"], bikes["fps"], bikes["folder"], "gop5", gop_seconds=5)
    code, document = qc(str(gop))
    assert code == 3 and set(failed(document)) == {"video.gop_seconds"}


def test_a_truncated_file_is_found(bikes: dict, tmp_path: Path):
    data = bikes["clean"].read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: len(data) * 2 // 3])
    code, document = qc(str(cut), "--reference", str(bikes["reference"]))
    assert code == 3
    why = failed(document)
    assert {"video.decodes", "video.frames_decoded"} & set(why)
    headless = tmp_path / "headless.mp4"
    headless.write_bytes(data[len(data) // 3 :])
    code, document = qc(str(headless))
    assert code == 3 and "cannot be opened" in failed(document)["video.opens"]


def test_bad_input_is_exit_2(tmp_path: Path, bikes: dict):
    missing = run_cli_here("qc", str(tmp_path / "nope.mp4"), env={})
    assert missing.returncode == 2 and "VIDEO" in missing.stderr
    bad_seams = run_cli_here("qc", str(bikes["clean"]), "--seams", "soon", env={})
    assert bad_seams.returncode == 2 and "--seams" in bad_seams.stderr
    outside = run_cli_here("qc", str(bikes["clean"]), "--seams", "42", env={})
    assert outside.returncode == 2 and "not inside the video" in outside.stderr


def test_without_libvmaf_vmaf_is_unavailable_never_invented(bikes: dict, tmp_path: Path):
    reference = Reference([(bikes["reference"], None)], *bikes["frames"].shape[2:0:-1])
    measured = analyze(
        {"v": bikes["clean"]},
        bikes["fps"],
        10.0,
        reference=reference,
        work=tmp_path,
        use_vmaf=False,
    )["v"]
    summary = gate.fidelity(measured)
    assert summary["vmaf"] is None and "unavailable" in summary["vmaf_note"]
    assert summary["psnr_y"]["mean"] >= 38 and summary["source"] == "psnr/ssim filters"
    assert {c.name for c in gate.fidelity_checks(summary, gate_limits())} == {"psnr_y", "ssim"}


def test_frames_are_paired_by_index_not_timestamp(bikes: dict, tmp_path: Path):
    """The MP4 (timebase 1/12288) against the FFV1 MKV (ms): paired by timestamp, PSNR would
    collapse (27.6 dB instead of 45.9 in ../shared/reference/VIDEO_NOTES.md)."""
    reference = Reference([(bikes["reference"], None)], *bikes["frames"].shape[2:0:-1])
    measured = analyze(
        {"v": bikes["clean"]}, bikes["fps"], 10.0, reference=reference, work=tmp_path
    )["v"]
    assert len(measured.per_frame["psnr_y"]) == len(bikes["frames"])  # every frame
    assert min(measured.per_frame["psnr_y"]) >= 35
    every_third = analyze(
        {"v": bikes["clean"]},
        bikes["fps"],
        10.0,
        reference=reference,
        work=tmp_path / "s3",
        subsample=3,
    )["v"]
    assert every_third.per_frame["frame"][:3] == [0.0, 3.0, 6.0]
    full = dict(zip(measured.per_frame["frame"], measured.per_frame["psnr_y"], strict=True))
    for frame, psnr in zip(
        every_third.per_frame["frame"], every_third.per_frame["psnr_y"], strict=True
    ):
        assert psnr == pytest.approx(full[frame], abs=1e-3)  # the same frames, the same pairs


def gate_limits():
    from factory.qc.thresholds import QcThresholds

    return QcThresholds()


def test_a_threshold_from_settings_changes_the_verdict(bikes: dict):
    env = {**home_env(Path("/nonexistent")), "FACTORY_QC_MIN_PSNR": "80"}
    code, document = qc(str(bikes["clean"]), "--reference", str(bikes["reference"]), env=env)
    assert code == 3 and "below 80.0 dB" in failed(document)["video.psnr_y"]
    assert document["thresholds"]["min_psnr"] == 80
