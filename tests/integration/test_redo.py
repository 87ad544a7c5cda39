"""Redo a time range of a delivered video (`factory redo`): only the covering segments are
made again, the join into the untouched rest is cross-faded and judged, only the changed
chunks are encoded again, and the result is delivered as version 2 beside version 1. Embedded
(real ffmpeg, SQLite or PostgreSQL) and through real Celery workers with a kill -9."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from factory.generate import SegmentSpec
from factory.generate.base import PromptEmbedding
from factory.generate.procedural import ProceduralGenerator
from factory.manifest import parse_manifest
from factory.media.intermediate import read_frames
from factory.media.probe import probe, video_packet_digests
from factory.ops import Operations
from factory.ops.submit import submit
from factory.pipeline.runner import run_job
from factory.plan.chunks import chunk_keyframes, plan_chunks
from factory.plan.video import video_plan
from factory.spec import ModelChoice, VideoSpec
from factory.stages import Stage
from factory.store import keys
from tests.conftest import HomeSnapshot, run_cli, run_cli_here
from tests.integration.cluster import Cluster, manifest
from tests.integration.test_pipeline import home_env, in_process

FPS = 12
LONG = (
    "batch: redo\ndefaults: {duration: 24, fps: 12, resolution: 160x96, "
    "segment: {frames: 24, overlap: 4}, renditions: [mobile, compat], seed: 5}\n"
    "videos:\n  - {id: long, prompt: 'a harbor at dawn, slow pan'}\n"
)  # 288 frames: 15 segments of 20 new frames, 4 chunks (8, 4, 2, 1 segments)


def lossless(store: Path, job_id: str, attempts: dict[int, int | None]) -> np.ndarray:
    """The whole video as the segments hold it (before any encoding), from given files."""
    batch, video = job_id.split(".")
    frames = [
        read_frames(store / keys.segment(batch, video, index, attempt), 160, 96)
        for index, attempt in sorted(attempts.items())
    ]
    return np.concatenate(frames)


def attempts_of(env: dict[str, str], job_id: str) -> dict[int, int | None]:
    status = json.loads(run_cli_here("status", job_id, "--json", env=env).stdout)
    return {s["index"]: s.get("attempt") for s in status["segments_made"]}


def digests(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _deliver_long(home: Path) -> None:
    manifest = home.parent / "m.yaml"
    manifest.write_text(LONG)
    done = run_cli_here("run", str(manifest), env=home_env(home), timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def v1_snapshot(tmp_path_factory) -> HomeSnapshot:
    """redo.long delivered as version 1, made once for the module and put back for each test."""
    return HomeSnapshot(tmp_path_factory.mktemp("redo-v1"), _deliver_long)


@pytest.fixture
def delivered_v1(v1_snapshot: HomeSnapshot, tmp_path: Path) -> tuple[dict[str, str], Path]:
    """(env, store) of a home where redo.long is delivered as version 1, never redone; its
    manifest is tmp_path/m.yaml."""
    home = v1_snapshot.restore()
    (tmp_path / "m.yaml").write_text(LONG)
    return home_env(home), home / "store"


def test_a_redo_changes_only_its_range_and_delivers_version_2(delivered_v1, tmp_path: Path) -> None:
    env, store = delivered_v1
    v1_records = attempts_of(env, "redo.long")
    v1_files = {p: digests(store / "redo/long/out" / p) for p in ("mobile.mp4", "compat.mp4")}
    chunks_before = {
        r: set((store / "redo/long/chunks" / r).iterdir()) for r in ("mobile", "compat")
    }

    dry = run_cli_here("redo", "redo.long", "--range", "0:10-0:14", "--dry-run", "--json", env=env)
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert (plan["segments"], plan["join"], plan["chunks"]) == ([6, 7, 8], 9, [0, 1])
    assert attempts_of(env, "redo.long") == v1_records  # a dry run changes nothing
    human = run_cli_here("redo", "redo.long", "--range", "0:10-0:14", "--dry-run", env=env).stdout
    assert "segments  6-8 made again (3)" in human
    assert f"encode    {plan['encode_frames']} frames again per rendition" in human
    assert "chunks 0, 1 (2 of 4" in human

    done = run_cli_here("redo", "redo.long", "--range", "0:10-0:14", "--seed", "99",
                   "--reason", "a gull melts", env=env, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "version 2 delivered" in done.stdout
    status = json.loads(run_cli_here("status", "redo.long", "--json", env=env).stdout)
    assert status["stage"] == "done"
    assert status["version"] == 2
    assert [v["version"] for v in status["versions"]] == [1, 2]
    assert status["versions"][1]["reason"] == "a gull melts"
    # Version 1 stays delivered as it was; version 2 lies beside it.
    assert {p: digests(store / "redo/long/out" / p) for p in v1_files} == v1_files
    assert (store / "redo/long/v2/out/mobile.mp4").stat().st_size > 0
    assert (store / "redo/long/v2/qc.json").exists()

    # Frames: outside the redone segments and the join, bit for bit version 1's.
    v2_records = attempts_of(env, "redo.long")
    changed = {i for i in v2_records if v2_records[i] != v1_records[i]}
    assert changed == {6, 7, 8, 9}
    before, after = (
        lossless(store, "redo.long", v1_records),
        lossless(store, "redo.long", v2_records),
    )
    start, end = plan["changed_start"], plan["changed_end"]
    assert (start, end) == (120, 184)  # segment 6's first frame to the end of 9's overlap
    assert np.array_equal(before[:start], after[:start])
    assert np.array_equal(before[end:], after[end:])
    assert not np.array_equal(before[start:end], after[start:end])

    # Encoding: exactly the planned chunks were made again, per rendition, and in them only
    # the GOPs that hold changed frames were encoded: in the delivered files every other
    # GOP's packets are version 1's, so its pictures decode bit for bit as version 1's.
    for rendition in ("mobile", "compat"):
        made = set((store / "redo/long/chunks" / rendition).iterdir()) - chunks_before[rendition]
        assert len(made) == len(plan["chunks"]), rendition
    video = parse_manifest(LONG).videos[0]
    assert_only_changed_gops_differ(store, video, plan, start, end)

    # The new seams, the join's included, were judged; the timeline says who asked and why.
    seams = {s["index"]: s for s in status["segments_made"]}
    assert seams[9]["seam"]["join"] is True and seams[9]["seam"]["passed"] is True
    events = json.loads(run_cli_here("events", "redo.long", "--json", env=env).stdout)
    planned = next(e for e in events if e["event"] == "redo.planned")
    assert planned["detail"]["reason"] == "a gull melts" and planned["detail"]["seed"] == 99
    assert planned["detail"]["actor"].startswith("cli:")
    assert [e["detail"]["segment"] for e in events if e["event"] == "redo.segment.done"] == [
        6,
        7,
        8,
    ]
    assert any(e["event"] == "redo.delivered" for e in events)
    text = run_cli_here("status", "redo.long", env=env).stdout
    assert "v2 (published)" in text and "redo 10-14 s, segments 6-8" in text


def gops_of(video: VideoSpec) -> list[tuple[int, int]]:
    """(first frame, frames) of every GOP of a delivered file, as the chunks lay them out."""
    gops = []
    for chunk in plan_chunks(video):
        starts = chunk_keyframes(video, chunk)
        for a, b in zip(starts, [*starts[1:], chunk.frames], strict=True):
            gops.append((chunk.first_frame + a, b - a))
    return gops


def assert_only_changed_gops_differ(
    store: Path, video: VideoSpec, plan: dict, start: int, end: int
) -> None:
    gops = gops_of(video)
    counts = [n for _, n in gops]
    touched = [a < end and a + n > start for a, n in gops]
    assert sum(n for (_, n), t in zip(gops, touched, strict=True) if t) == plan["encode_frames"]
    assert plan["encode_frames"] < plan["chunks_frames"]
    base = store / video.batch / video.video_id
    for rendition in video.renditions:
        old = video_packet_digests(base / f"out/{rendition}.mp4", counts)
        new = video_packet_digests(base / f"v2/out/{rendition}.mp4", counts)
        same = [o == n for o, n in zip(old[: len(counts)], new[: len(counts)], strict=True)]
        assert same == [not t for t in touched], rendition
        before, after = (
            decode(base / f"out/{rendition}.mp4"),
            decode(base / f"v2/out/{rendition}.mp4"),
        )
        assert len(before) == len(after) == video.frames_total
        for (a, n), t in zip(gops, touched, strict=True):
            if not t:
                assert all(np.array_equal(before[i], after[i]) for i in range(a, a + n)), a


def test_with_keyframes_at_segments_every_frame_outside_the_redone_segments_is_kept(
    tmp_path: Path,
) -> None:
    """`keyframes: segments`: GOPs start at every segment's first frame, so the redo encodes
    only the redone segments and the one it joins into; every other frame of every delivered
    rendition decodes bit for bit as version 1's."""
    text = LONG.replace("seed: 5}", "seed: 5, keyframes: segments}")
    env = home_env(tmp_path / "home")
    (tmp_path / "m.yaml").write_text(text)
    done = run_cli_here("run", str(tmp_path / "m.yaml"), env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    store = tmp_path / "home" / "store"
    video = parse_manifest(text).videos[0]
    assert video.keyframes == "segments"
    plan = json.loads(run_cli_here("redo", "redo.long", "--range", "0:10-0:14", "--dry-run",
                              "--json", env=env).stdout)  # fmt: skip
    done = run_cli_here("redo", "redo.long", "--range", "0:10-0:14", "--seed", "99", env=env,
                   timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    plans = video_plan(video)
    first, last = plans[plan["segments"][0]], plans[plan["join"]]
    assert_only_changed_gops_differ(store, video, plan, plan["changed_start"], plan["changed_end"])
    # Every re-encoded GOP lies inside the redone segments and the joined one.
    gops = gops_of(video)
    for a, n in gops:
        if a < plan["changed_end"] and a + n > plan["changed_start"]:
            assert first.write_start <= a and a + n <= last.write_end
    for rendition in video.renditions:
        probe_v1 = probe(store / f"redo/long/out/{rendition}.mp4").video
        assert probe_v1.max_gop_seconds <= 2.0 and probe_v1.open_keyframes == 0
        keyframes = {round(t * FPS) for t in probe_v1.keyframe_times}
        assert {p.write_start for p in plans} <= keyframes


def test_after_a_requeue_from_qc_a_redo_still_reuses_the_untouched_chunks(
    delivered_v1, tmp_path: Path
):
    """A requeue --from qc starts a new epoch but keeps the joined chunks; a redo after it
    must name its chunks by that joined epoch, or every chunk would be encoded again."""
    env, store = delivered_v1
    requeued = json.loads(run_cli_here("requeue", "redo.long", "--from", "qc", "--json",
                                  env=env).stdout)  # fmt: skip
    assert requeued["stage"] == "qc"
    _, ctx = in_process(Path(env["FACTORY_HOME"]))
    assert run_job(ctx, "redo.long", worker="t").stage is Stage.DONE
    before = {r: set((store / "redo/long/chunks" / r).iterdir()) for r in ("mobile", "compat")}
    plan = json.loads(run_cli_here("redo", "redo.long", "--range", "0:10-0:14", "--dry-run",
                              "--json", env=env).stdout)  # fmt: skip
    done = run_cli_here("redo", "redo.long", "--range", "0:10-0:14", "--seed", "3", env=env,
                   timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    for rendition, chunks in before.items():
        made = set((store / "redo/long/chunks" / rendition).iterdir()) - chunks
        assert len(made) == len(plan["chunks"]) == 2, rendition


def test_a_redo_with_a_new_prompt_shows_it_in_the_range(delivered_v1, tmp_path: Path) -> None:
    env, store = delivered_v1
    v1 = attempts_of(env, "redo.long")
    done = run_cli_here("redo", "redo.long", "--range", "20-24", "--prompt", "a red boat at dusk",
                   env=env, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    status = json.loads(run_cli_here("status", "redo.long", "--json", env=env).stdout)
    new = "a red boat at dusk"
    assert status["progress"]["prompts"] == [[12, 15, new]]
    v2 = attempts_of(env, "redo.long")
    assert {i for i in v2 if v2[i] != v1[i]} == {12, 13, 14}  # to the end: no join after
    before, after = lossless(store, "redo.long", v1), lossless(store, "redo.long", v2)
    assert np.array_equal(before[:240], after[:240]) and not np.array_equal(before, after)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("0:14-0:10", "ends before it starts"),
        ("0:20-0:30", "outside the video, which is 0:24"),
        ("ten-twenty", "is not a time"),
        ("10", "is not START-END"),
    ],
)
def test_bad_ranges_exit_2_naming_the_problem(tmp_path: Path, text: str, says: str) -> None:
    env = home_env(tmp_path / "home")
    (tmp_path / "m.yaml").write_text(LONG.replace("duration: 24", "duration: 24"))
    assert run_cli_here("submit", str(tmp_path / "m.yaml"), env=env).returncode == 0
    refused = run_cli_here("redo", "redo.long", "--range", text, "--dry-run", env=env)
    assert refused.returncode == 2
    assert "--range" in refused.stderr and says in refused.stderr


def test_only_a_delivered_job_is_redone_and_one_redo_at_a_time(tmp_path: Path) -> None:
    home = tmp_path / "home"
    factory, ctx = in_process(home)
    job = submit(parse_manifest(LONG), factory.jobs, None).jobs[0]
    ops = Operations(factory, dispatcher=lambda found: None)  # started, not run
    with pytest.raises(Exception, match="only a delivered"):
        ops.redo(job.job_id, range_text="10-14", actor="test", seed=1)
    run_job(ctx, job.job_id, worker="test")
    plan, started = ops.redo(job.job_id, range_text="10-14", actor="test", seed=1)
    assert started.stage is Stage.GENERATE
    with pytest.raises(Exception, match="a redo of it is running"):
        ops.redo(job.job_id, range_text="2-3", actor="test", seed=2)
    dropped = ops.cancel(job.job_id, reason="not now", actor="test")
    assert dropped.stage is Stage.DONE and dropped.version == 1  # the redo is dropped
    plan, again = ops.redo(job.job_id, range_text="10-14", actor="test", seed=1)
    done = run_job(ctx, again.job_id, worker="test")
    assert done.stage is Stage.DONE and done.version == plan.version == 2


def test_a_redo_that_fails_qc_leaves_version_1_delivered(delivered_v1, tmp_path: Path) -> None:
    env, store = delivered_v1
    v1 = digests(store / "redo/long/out/mobile.mp4")
    strict = {**env, "FACTORY_QC_MIN_VMAF": "99.9"}
    failed = run_cli_here("redo", "redo.long", "--range", "3-5", env=strict, timeout=600)
    assert failed.returncode == 1
    assert "version 1 stays delivered" in failed.stderr
    status = json.loads(run_cli_here("status", "redo.long", "--json", env=env).stdout)
    assert (status["stage"], status["stopped_stage"]) == ("failed", "qc")
    assert status["version"] == 1
    assert [v["version"] for v in status["versions"]] == [1]
    assert digests(store / "redo/long/out/mobile.mp4") == v1
    assert not (store / "redo/long/v2").exists()
    # Fixed (here: the limit), the redo continues from where it stopped and delivers.
    assert run_cli_here("requeue", "redo.long", env=env).returncode == 0
    resumed = run_cli_here("run", str(tmp_path / "m.yaml"), env=env, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    status = json.loads(run_cli_here("status", "redo.long", "--json", env=env).stdout)
    assert status["version"] == 2


class SpoiledTail(ProceduralGenerator):
    """Procedural frames whose tail turns red in one segment for one seed: the join after a
    redone segment made with that seed jumps."""

    def __init__(self, segment: int) -> None:
        self.segment = segment
        self.spoiled_seeds: set[int] = set()

    def generate(self, seg: SegmentSpec, prompt: PromptEmbedding, context, seed: int):
        frames = super().generate(seg, prompt, context, seed)
        if seg.index == self.segment and not self.spoiled_seeds:
            self.spoiled_seeds.add(seed)
        if seg.index == self.segment and seed in self.spoiled_seeds:
            red = frames[-4:].astype(np.int16)
            red[..., 0] += 120
            frames[-4:] = np.clip(red, 0, 255).astype(np.uint8)
        return frames


def test_a_bad_join_is_made_again_with_a_new_seed(tmp_path: Path) -> None:
    factory, ctx = in_process(tmp_path / "home")
    job = submit(parse_manifest(LONG), factory.jobs, None).jobs[0]
    run_job(ctx, job.job_id, worker="test")
    spoiled = SpoiledTail(segment=8)
    ctx._generators[ModelChoice("procedural")] = spoiled
    ops = Operations(factory, dispatcher=lambda found: None)
    ops.redo(job.job_id, range_text="10-14", actor="test", seed=3)
    done = run_job(ctx, job.job_id, worker="test")
    assert done.stage is Stage.DONE, done.last_error
    regenerated = [e for e in factory.jobs.events(job.job_id) if e.event == "seam.regenerated"]
    assert [(e.detail["segment"], e.detail["seam"]) for e in regenerated] == [(8, 9)]
    join = factory.jobs.segment(job.job_id, 9)
    assert join.seam["join"] and join.seam["passed"] and join.seam["regenerations"] == 1


def test_kill_9_mid_redo_recovers_with_identical_output(cluster: Cluster, tmp_path: Path):
    """Two identical videos; the same redo of both; a GPU worker killed in the middle of one.
    The killed one resumes from its last recorded segment and makes the same frames: both
    version 2s hold the same lossless video and decode to the same pictures (within the
    encoder: see docs/jobs.md, "Redo")."""
    path = manifest(tmp_path / "m.yaml", "twins", videos=2, seconds_per_segment=0.3, duration=12)
    path.write_text(re.sub(r"scene number \d", "same", path.read_text()))
    cluster.start_workers(gpus=1)
    ids = cluster.submit(path)
    cluster.wait_done(ids)
    first = run_cli("redo", ids[0], "--range", "4-8", "--seed", "42", env=cluster.env)
    assert first.returncode == 0, first.stderr
    second = run_cli("redo", ids[1], "--range", "4-8", "--seed", "42", env=cluster.env)
    assert second.returncode == 0, second.stderr
    machine = cluster.factory().jobs
    deadline = time.monotonic() + 60
    while not [e for e in machine.events(ids[1]) if e.event == "redo.segment.done"]:
        assert time.monotonic() < deadline, cluster.logs()
        time.sleep(0.05)
    os.kill(cluster.children("gpu0")[0], signal.SIGKILL)  # mid-redo
    jobs = cluster.wait_done(ids, timeout=300)
    assert [j.stage for j in jobs] == [Stage.DONE, Stage.DONE], cluster.logs()
    assert [j.version for j in jobs] == [2, 2]
    assert [e for e in machine.events(ids[1]) if e.event == "recovered"], "not taken over"
    store = cluster.home / "store"
    made = [machine.segments(j.job_id) for j in jobs]
    videos = [
        np.concatenate([read_frames(store / keys.segment(j.batch, j.spec["video_id"], i, r.attempt),
                                    96, 64) for i, r in sorted(m.items())])
        for j, m in zip(jobs, made, strict=True)
    ]  # fmt: skip
    assert np.array_equal(videos[0], videos[1])  # every frame made again is the same
    assert [r.seam for r in made[0].values()] == [r.seam for r in made[1].values()]
    pictures = [decode(store / j.batch / j.spec["video_id"] / "v2/out/mobile.mp4") for j in jobs]
    assert len(pictures[0]) == len(pictures[1]) == 96
    assert min(psnr(a, b) for a, b in zip(*pictures, strict=True)) > 40


def decode(path: Path) -> list[np.ndarray]:
    import av

    with av.open(str(path)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 99.0 if mse == 0 else 10 * float(np.log10(255**2 / mse))
