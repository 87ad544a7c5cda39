"""A redo that swaps a scene's picture or camera move (issue 38, item 5: `factory redo JOB
--image 0=./green.png`, `--camera 1=KEY,strength=0.5`), through the whole embedded pipeline:
exactly the scene's segments are made again with the new material (keeping their seeds), the
new first frame is the new picture (in the lossless segment and the delivered file), the
version before stays as it was, the version's record and `factory status` name the swap, a
remake from nothing keeps it, a cancelled swap puts the material back, and a remake after gc
replays an earlier redo's join with the picture that redo was made with. Every refusal names
its option and changes nothing, stores nothing."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from factory.errors import BadInput, FactoryError
from factory.manifest import parse_manifest
from factory.media.images import load_image
from factory.media.intermediate import read_frames
from factory.ops import Operations
from factory.ops.preflight import content_key
from factory.ops.submit import submit
from factory.pipeline.files import Segments
from factory.pipeline.runner import run_job
from factory.plan.video import video_plan
from factory.stages import Stage
from factory.store import keys
from tests.conftest import run_cli_here
from tests.integration.test_camera import pan_template
from tests.integration.test_images import HEIGHT, WIDTH, manifest, pictures
from tests.integration.test_pipeline import home_env, in_process
from tests.integration.test_shots import decoded, psnr_y


def green_picture(path: Path) -> None:
    """Unlike hero.png in every way: green, with a black square where hero has a white disc."""
    picture = Image.new("RGB", (480, 300), (40, 170, 60))
    ImageDraw.Draw(picture).rectangle((60, 40, 200, 180), fill=(10, 10, 10))
    picture.save(path)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def lossless(ctx, job, indices=None) -> np.ndarray:
    made = Segments.load(ctx.machine, job)
    plans = [p for p in video_plan(job.video) if indices is None or p.index in indices]
    return np.concatenate([read_frames(ctx.store.path(made.segment(p.index)), job.video.width,
                                       job.video.height)[: p.owned_count]
                           for p in plans if p.owned_count])  # fmt: skip


def delivered(folder: Path):
    """The pictures video (scene 0: hero.png as its first frame; scene 1, after a cut: red.jpg
    as a reference) made and delivered as version 1."""
    pictures(folder)
    green_picture(folder / "green.png")
    (folder / "not-a-picture.png").write_bytes(b"\x89PNG but not really")
    factory, ctx = in_process(folder / "home")
    ops = Operations(factory, dispatcher=lambda found: None)
    parsed = ops.check(parse_manifest(manifest(folder).read_text(), source=str(manifest(folder))))
    from factory.ops import preflight

    preflight.upload(parsed, ctx.store)
    job = submit(parsed.manifest, factory.jobs, None).jobs[0]
    job = run_job(ctx, job.job_id, worker="t")
    assert job.stage is Stage.DONE, job.last_error
    return ctx, ops, job


def test_a_redo_swaps_a_scenes_first_frame(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    ctx, ops, job = delivered(tmp_path)
    monkeypatch.chdir(tmp_path)  # `factory redo` reads a picture beside where it runs
    plans = video_plan(job.video)
    scene0 = tuple(p.index for p in plans if p.scene == 0)
    before = {i: r.attempt for i, r in ctx.machine.segments(job.job_id).items()}
    v1 = ctx.store.path(keys.output("pics", "v", "master", 1))
    v1_digest = digest(v1)
    green_key = content_key(tmp_path / "green.png")
    hero_key = job.video.scenes[0].image.asset
    red = job.video.scenes[1].image

    # The dry run checks the picture and plans the scene's segments; it stores nothing.
    _, plan = ops.redo_plan(job.job_id, range_text=None, cascade=False, images=["0=./green.png"])
    assert plan.segments == scene0
    assert plan.material == ({"scene": 0, "kind": "image", "from": f"{hero_key} (as=first-frame)",
                              "to": f"{green_key} (as=first-frame)"},)  # fmt: skip
    assert not ctx.store.exists(green_key)

    plan, started = ops.redo(job.job_id, range_text=None, images=["0=./green.png"],
                             reason="the new product", actor="test")  # fmt: skip
    assert started.progress["redo"]["seed"] is None  # the scene keeps its seeds
    assert ctx.store.exists(green_key)
    job = ops.run_here(job.job_id, "test")
    assert job.stage is Stage.DONE and job.version == 2, job.last_error
    after = {i: r.attempt for i, r in ctx.machine.segments(job.job_id).items()}
    assert {i for i in after if after[i] != before[i]} == set(scene0)  # exactly the scene's
    assert job.video.scenes[0].image.asset == green_key
    assert job.video.scenes[1].image == red  # the other scene keeps its own

    green = load_image(tmp_path / "green.png", WIDTH, HEIGHT, "pad")
    hero = load_image(tmp_path / "hero.png", WIDTH, HEIGHT, "pad")
    first = lossless(ctx, job, {0})
    assert psnr_y(first[0], green) >= 35, psnr_y(first[0], green)
    assert psnr_y(first[0], hero) < 25
    shown = decoded(ctx.store.path(keys.output("pics", "v", "master", 2)))
    assert psnr_y(shown[0], green) >= 35, psnr_y(shown[0], green)
    assert digest(v1) == v1_digest  # version 1 as it was: the hero still opens it
    assert psnr_y(decoded(v1)[0], hero) >= 35

    record = {v.version: v for v in ctx.machine.versions(job.job_id)}[2]
    assert record.detail["material"] == [dict(m) for m in plan.material]
    assert record.detail["before"]["material"] is None
    assert json.loads(ctx.store.path(keys.qc_report("pics", "v", 2)).read_text())["passed"]
    status = run_cli_here("status", "pics.v", env=home_env(tmp_path / "home")).stdout
    assert "material changed: scene 0 image" in status, status
    assert f"picture    scene 0 first-frame: {green_key}" in status, status

    # A remake from nothing keeps the swap: the same frames, bit for bit.
    kept = lossless(ctx, job)
    ops.requeue(job.job_id, from_stage=Stage.GENERATE, actor="test")
    job = ops.run_here(job.job_id, "test")
    assert job.stage is Stage.DONE and job.version == 3, job.last_error
    assert np.array_equal(lossless(ctx, job), kept)

    # A cancelled swap puts the picture back (and removes nothing it did not add).
    ops.redo(job.job_id, range_text=None, images=["0=none"], actor="test")
    assert ctx.machine.get(job.job_id).video.scenes[0].image is None
    cancelled = ops.cancel(job.job_id, reason="keep the green one", actor="test")
    assert cancelled.stage is Stage.DONE and cancelled.version == 3
    assert cancelled.video.scenes[0].image.asset == green_key


def test_swaps_that_cannot_be_made_are_refused_and_change_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    ctx, ops, job = delivered(tmp_path)
    monkeypatch.chdir(tmp_path)
    pan_template(tmp_path / "pan.mkv")
    hero_key = job.video.scenes[0].image.asset
    cases = [
        ({"images": ["2=./green.png"]}, "--image", "the video has scenes 0-1"),
        ({"images": ["0=./missing.png"]}, "--image 0", "does not exist"),
        ({"images": ["0=./not-a-picture.png"]}, "--image 0", ""),
        ({"images": ["0=./../outside.png"]}, "--image 0", "leads out of"),
        ({"images": ["0=../outside.png"]}, "--image 0", "not a valid store key"),
        ({"images": ["0=./hero.png"]}, "--image", "already has this image"),
        ({"images": [f"0={hero_key}"]}, "--image", "already has this image"),
        ({"cameras": ["0=none"]}, "--camera", "has no camera"),
        ({"images": ["0=./green.png,as=sideways"]}, "--image", "is not one of"),
        ({"images": ["0=./green.png,size=2"]}, "--image", "is not one of as=..."),
        ({"cameras": ["1=./pan.mkv,strength=2"]}, "--camera", "outside 0 to 1"),
        (
            {"cameras": ["1=./green.png"]},
            "--camera 1",
            "is not a video file (MP4/MOV or Matroska/WebM: holds PNG)",
        ),
        ({"images": ["0=./green.png", "0=none"]}, "--image", "given twice"),
        ({"images": ["0=./green.png"], "range_text": "1-2"}, "--range", "leave out --range"),
        ({"images": ["0=./green.png"], "joins": ["1=dissolve:1"]}, "--join", "of its own"),
        ({"images": ["0=./green.png"], "remote": True}, "--image 0", "sent over the API"),
        ({"images": ["1=./green.png,as=first-frame", "0=./green.png"]}, None, None),
    ]
    before = ctx.machine.get(job.job_id)
    for keywords, field, said in cases:
        given = {"range_text": None, **keywords}
        if field is None:  # two neighbouring scenes at once: accepted (checked, not run)
            _, plan = ops.redo_plan(job.job_id, cascade=False, **given)
            assert set(plan.segments) == {p.index for p in video_plan(job.video)}
            continue
        with pytest.raises(FactoryError) as caught:
            ops.redo(job.job_id, actor="test", **given)
        assert isinstance(caught.value, BadInput), caught.value
        assert caught.value.field == field, (keywords, caught.value)
        assert said in str(caught.value), (keywords, str(caught.value))
        now = ctx.machine.get(job.job_id)
        assert (now.stage, now.attempt, now.progress) == (
            before.stage, before.attempt, before.progress
        ), keywords  # fmt: skip
    assert not ctx.store.exists(content_key(tmp_path / "green.png"))
    assert not ctx.store.exists(content_key(tmp_path / "pan.mkv"))


CONTINUING = """\
batch: swap
videos:
  - id: v
    duration: 4
    fps: 12
    resolution: 64x64
    segment: {frames: 24, overlap: 4}
    renditions: [mobile]
    keyframes: segments
    scenes:
      - {start: 0, prompt: a bright studio, image: {asset: PICTURE, as: reference}}
      - {start: 2.5, prompt: a quiet harbor}
"""


def test_a_remake_after_gc_replays_an_earlier_join_with_the_picture_it_was_made_with(
    tmp_path: Path,
):
    """Segment 1 is joined into by a redo of segment 0 made while scene 0 had the hero as
    its reference; a later redo swaps scene 0's picture and makes segments 0-1 again, joined
    into segment 2. After gc, a remake from nothing has to make the first redo's join from
    segment 1 as the hero made it: with today's picture it would differ. (The new picture
    is the hero mirrored: the same colours, so the join into the untouched scene passes.)"""
    pictures(tmp_path)
    mirrored = Image.open(tmp_path / "hero.png").transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    mirrored.save(tmp_path / "mirrored.png")
    factory, ctx = in_process(tmp_path / "home")
    ops = Operations(factory, dispatcher=lambda found: None)
    for name in ("hero.png", "mirrored.png"):
        ctx.store.put_file(f"material/{name}", tmp_path / name)
    text = CONTINUING.replace("PICTURE", "material/hero.png")
    job = submit(parse_manifest(text), factory.jobs, None).jobs[0]
    job = run_job(ctx, job.job_id, worker="t")
    assert job.stage is Stage.DONE, job.last_error
    assert [p.scene for p in video_plan(job.video)] == [0, 0, 1]
    ops.redo(job.job_id, range_text="0-1", seed=77, actor="test")  # segment 0, joined into 1
    job = ops.run_here(job.job_id, "test")
    assert job.stage is Stage.DONE, job.last_error
    plan, _ = ops.redo(job.job_id, range_text=None, images=["0=material/mirrored.png"],
                       actor="test")  # fmt: skip
    assert plan.segments == (0, 1) and plan.join == 2
    job = ops.run_here(job.job_id, "test")
    assert job.stage is Stage.DONE and job.version == 3, job.last_error
    kept = lossless(ctx, job)

    report = ops.gc(older_than=0, batch="swap")
    assert report is not None
    ops.requeue(job.job_id, from_stage=Stage.GENERATE, actor="test")
    job = ops.run_here(job.job_id, "test")
    assert job.stage is Stage.DONE and job.version == 4, job.last_error
    assert np.array_equal(lossless(ctx, job), kept)
