"""A scene's picture (issue 38, item 1) through the whole embedded pipeline: a first frame
starts its shot from the picture (frame 0 within 35 dB PSNR of it, in the lossless segment
and in the delivered file), then moves into the scene's own motion; a reference picture
gives its scene its colours; what cannot use a picture is refused at submit, naming the
field and the families that can."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from factory.media.images import load_image
from factory.media.intermediate import read_frames
from factory.pipeline.files import Segments
from factory.plan.video import video_plan
from factory.stages import Stage
from factory.store import keys
from tests.conftest import run_cli_here
from tests.integration.test_pipeline import home_env, in_process
from tests.integration.test_shots import decoded, psnr_y

WIDTH, HEIGHT = 320, 192


def pictures(folder: Path) -> None:
    hero = Image.new("RGB", (640, 400))
    draw = ImageDraw.Draw(hero)
    for y in range(400):  # blue to yellow, a white disc and a dark bar: easy to tell apart
        draw.line([(0, y), (640, y)], fill=(int(40 + y * 0.5), int(60 + y * 0.45), 200 - y // 3))
    draw.ellipse((240, 120, 400, 280), fill=(250, 250, 250))
    draw.rectangle((40, 300, 600, 330), fill=(20, 20, 30))
    hero.save(folder / "hero.png")
    red = Image.new("RGB", (300, 300), (210, 40, 30))
    ImageDraw.Draw(red).rectangle((0, 0, 150, 300), fill=(120, 20, 10))
    red.save(folder / "red.jpg", quality=95)


def manifest(folder: Path, family: str = "procedural", first_join: str = "cut") -> Path:
    path = folder / "m.yaml"
    model = {"procedural": "procedural", "timed": "{family: timed, seconds_per_segment: 0.1}"
             }.get(family, f"{{family: {family}, path: /models/x}}")  # fmt: skip
    segment = {"procedural": "{frames: 24, overlap: 4}", "ltx-video": "{frames: 25, overlap: 9}",
               "helios": "{frames: 41, overlap: 5}"}  # fmt: skip
    segment = segment.get(family, "{frames: 21, overlap: 5}")
    path.write_text(
        "batch: pics\nvideos:\n  - id: v\n    duration: 6\n    fps: 12\n"
        f"    resolution: {WIDTH}x{HEIGHT}\n    segment: {segment}\n"
        f"    renditions: [master]\n    model: {model}\n    scenes:\n"
        "      - {start: 0, prompt: a bright studio, image: {asset: ./hero.png}}\n"
        f"      - {{start: 3, prompt: a quiet harbor, join: {first_join}, "
        "image: {asset: ./red.jpg, as: reference}}\n"
    )
    return path


def test_a_first_frame_and_a_reference_picture_are_honoured(tmp_path: Path):
    pictures(tmp_path)
    env = home_env(tmp_path / "home")
    done = run_cli_here("run", str(manifest(tmp_path)), env=env, timeout=600)
    status = run_cli_here("status", "pics.v", env=env).stdout
    assert done.returncode == 0, status
    _, ctx = in_process(tmp_path / "home")
    job = ctx.machine.get("pics.v")
    assert job.stage is Stage.DONE, job.last_error
    assert json.loads(ctx.store.path(keys.qc_report("pics", "v")).read_text())["passed"]
    made, video = Segments.load(ctx.machine, job), job.video
    plans = video_plan(video)
    hero = load_image(tmp_path / "hero.png", WIDTH, HEIGHT, "pad")
    first = read_frames(ctx.store.path(made.segment(0)), WIDTH, HEIGHT)
    # The shot starts from the picture (only the grain added), then moves on from it.
    assert psnr_y(first[0], hero) >= 35, psnr_y(first[0], hero)
    assert psnr_y(first[-1], hero) < 25
    delivered = decoded(ctx.store.path(keys.output("pics", "v", "master")))
    assert psnr_y(delivered[0], hero) >= 35, psnr_y(delivered[0], hero)
    # The picture (1.6:1 into 1.67:1) was padded (the default rule): bars left and right.
    assert hero[:, :5].max() == 0 and hero[:, -5:].max() == 0 and hero[:, 8:-8].min() > 0
    # The reference scene takes its colours from the red picture: red over green and blue.
    shot = [p for p in plans if p.shot == 1 and p.owned_count]
    frames = np.concatenate([read_frames(ctx.store.path(made.segment(p.index)), WIDTH, HEIGHT)
                             [: p.owned_count] for p in shot]).astype(np.float64)  # fmt: skip
    red, green, blue = (frames[..., c].mean() for c in range(3))
    assert red > green + 40 and red > blue + 40, (red, green, blue)


@pytest.mark.parametrize(
    ("family", "first_join", "field", "said"),
    [
        (
            "ltx-video",
            "cut",
            "videos[0].scenes[1].image.as",
            "ltx-video cannot use a reference picture; families that can: procedural, wan",
        ),
        (
            "helios",
            "cut",
            "videos[0].scenes[1].image.as",
            "helios cannot use a reference picture; families that can: procedural, wan",
        ),
        (
            "timed",
            "cut",
            "videos[0].scenes[0].image.as",
            "timed cannot use a first-frame picture; families that can: procedural, "
            "skyreels-v2-df, wan, ltx-video, helios, anyflow-far",
        ),
        ("procedural", "continue", None, None),  # a reference picture may continue a shot
    ],
)
def test_a_family_that_cannot_use_a_picture_is_refused(tmp_path, family, first_join, field, said):
    pictures(tmp_path)
    env = home_env(tmp_path / "home")
    shown = run_cli_here("validate", str(manifest(tmp_path, family, first_join)), env=env)
    if field is None:
        assert shown.returncode == 0, shown.stderr
        return
    assert shown.returncode == 2 and f"{field}: {said}" in shown.stderr, shown.stderr


def test_a_first_frame_inside_a_shot_and_a_bad_picture_are_refused(tmp_path: Path):
    pictures(tmp_path)
    env = home_env(tmp_path / "home")
    path = manifest(tmp_path)
    path.write_text(path.read_text().replace("as: reference", "as: first-frame")
                    .replace("join: cut", "join: continue"))  # fmt: skip
    refused = run_cli_here("validate", str(path), env=env)
    assert refused.returncode == 2
    assert "videos[0].scenes[1].image.as: a first frame starts a shot" in refused.stderr
    (tmp_path / "hero.png").write_bytes(b"GIF89a not really")
    refused = run_cli_here("submit", str(manifest(tmp_path)), env=env)
    assert refused.returncode == 2
    assert "videos[0].scenes[0].image.asset: ./hero.png is not a picture" in refused.stderr
    assert "no job" in run_cli_here("status", "pics.v", env=env).stderr
