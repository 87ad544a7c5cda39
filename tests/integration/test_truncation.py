"""A copy cut short with its index intact (a faststart MP4 whose copy was interrupted) is named
`truncated` with the frames and seconds the container declares and those that decode, by
`factory qc` and by the pipeline's gate on its own deliverables; intact files pass it."""

from __future__ import annotations

import json
from pathlib import Path

import av
import pytest

from factory.manifest import parse_manifest
from factory.media.intermediate import write_segment
from factory.ops.submit import submit
from factory.pipeline import files
from factory.pipeline.encode import run_encode
from factory.pipeline.generate import run_generate
from factory.pipeline.mux import run_mux
from factory.pipeline.runner import run_job
from factory.stages import Stage
from tests import footage
from tests.conftest import run_cli
from tests.integration.test_pipeline import in_process

FPS, FRAMES = 12, 72  # 6.0 s


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    """Real camera footage, 72 frames at 12 fps, encoded and muxed like a master rendition
    (x265, hvc1, silence, +faststart: the index at the front)."""
    frames, _ = footage.decode(footage.bikes(), limit=FRAMES)
    return footage.deliverable(frames, FPS, tmp_path_factory.mktemp("truncation"), "whole")


def cut_after(path: Path, frames: int, out: Path) -> Path:
    """The first bytes of `path`, up to the end of its `frames`th video packet: what an
    interrupted copy leaves (the index at the front intact, the tail of mdat missing)."""
    with av.open(str(path)) as container:
        ends = [
            packet.pos + packet.size
            for packet in container.demux(container.streams.video[0])
            if packet.size
        ]
    out.write_bytes(path.read_bytes()[: max(ends[:frames])])
    return out


def qc(path: Path, *args: str) -> tuple[int, str]:
    done = run_cli("qc", str(path), *args, env={}, timeout=300)
    assert done.returncode in (0, 3), done.stderr
    return done.returncode, done.stdout


def test_a_copy_cut_short_with_its_index_intact_is_truncated(whole: Path, tmp_path: Path):
    cut = cut_after(whole, 43, tmp_path / "cut.mp4")
    assert 0.4 < cut.stat().st_size / whole.stat().st_size < 0.8
    code, out = qc(cut)
    assert code == 3
    assert "video.truncated: declared 72 frames / 6.0 s, decoded 43 / 3.6 s" in out
    code, report = qc(cut, "--json")
    check = next(
        c for c in json.loads(report)["renditions"]["video"]["checks"] if c["name"] == "truncated"
    )
    assert check["passed"] is False
    assert check["value"] == {"frames": 43, "seconds": pytest.approx(43 / FPS, abs=1e-3)}
    assert check["limit"] == {"frames": 72, "seconds": 6.0}


def test_a_copy_cut_at_any_byte_is_truncated(whole: Path, tmp_path: Path):
    data = whole.read_bytes()
    cut = tmp_path / "cut58.mp4"
    cut.write_bytes(data[: len(data) * 58 // 100])  # mid-packet: it also fails to decode
    code, out = qc(cut)
    assert code == 3 and "video.truncated: declared 72 frames / 6.0 s, decoded " in out


def test_an_intact_file_passes_the_truncated_check(whole: Path):
    code, report = qc(whole, "--json")
    assert code == 0, report
    check = next(
        c for c in json.loads(report)["renditions"]["video"]["checks"] if c["name"] == "truncated"
    )
    assert check == {
        "name": "truncated",
        "passed": True,
        "value": {"frames": 72, "seconds": 6.0},
        "limit": {"frames": 72, "seconds": 6.0},
    }


def test_a_matroska_file_cut_short_is_truncated_by_its_declared_duration(tmp_path: Path):
    """Matroska declares no frame count: its DURATION x fps is what is expected."""
    frames, _ = footage.decode(footage.bikes(), limit=FRAMES)
    whole = tmp_path / "whole.mkv"
    write_segment(whole, frames, FPS)
    code, out = qc(whole)
    assert "truncated" not in out
    cut = tmp_path / "cut.mkv"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size * 6 // 10])
    code, out = qc(cut)
    assert code == 3 and "video.truncated: declared 72 frames / 6.0 s, decoded " in out


MANIFEST = (
    "batch: cut\nvideos:\n  - id: v\n    prompt: a harbor at dawn\n"
    f"    duration: {FRAMES / FPS}\n    fps: {FPS}\n    resolution: 160x96\n"
    "    segment: {frames: 24, overlap: 4}\n    renditions: [mobile, compat]\n    seed: 7\n"
)


def test_the_gate_fails_a_truncated_rendition_before_delivery(tmp_path: Path):
    factory, ctx = in_process(tmp_path / "home")
    job = submit(parse_manifest(MANIFEST), factory.jobs, None).jobs[0]
    total = job.video.frames_total
    job = factory.jobs.claim(job.job_id, seen_attempt=job.attempt, worker="t")
    for stage in (run_generate, run_encode, run_mux):
        job = stage(ctx, job)
    assert job.stage is Stage.QC
    muxed = ctx.store.path(files.muxed(job, "compat"))
    kept = total * 6 // 10
    ctx.store.put_file(files.muxed(job, "compat"), cut_after(muxed, kept, tmp_path / "cut.mp4"))
    job = run_job(ctx, job.job_id, worker="t")
    assert job.stage is Stage.FAILED and job.stopped_stage is Stage.QC
    why = (
        f"compat.truncated: declared {total} frames / {total / FPS:.1f} s, "
        f"decoded {kept} / {kept / FPS:.1f} s"
    )
    assert why in job.last_error["message"]
    report = json.loads(ctx.store.path(job.progress["qc"]["report"]).read_text())
    assert "compat.truncated" in {f["check"] for f in report["failures"]}
    [mobile] = [c for c in report["renditions"]["mobile"]["checks"] if c["name"] == "truncated"]
    assert mobile["passed"] is True  # the intact rendition, with its audio, passes
    assert not list(ctx.store.list("cut/v/out"))  # nothing delivered
