"""Camera-move templates (issue 38, item 2) through the whole embedded pipeline: the procedural
generator follows the template's global motion (the delivered scene's content moves as the
template's does, by `strength` of it), a template is checked at submit, and a family that
cannot follow one is refused naming the field and the families that can."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

from factory.media.control import motion_track
from factory.media.intermediate import read_frames
from factory.pipeline.files import Segments
from factory.plan.video import video_plan
from factory.stages import Stage
from tests.conftest import run_cli_here
from tests.integration.test_pipeline import home_env, in_process

WIDTH, HEIGHT, FPS = 160, 96, 12
STEP = 3  # pixels a frame the template's content moves to the right


def pan_template(path: Path, frames: int = 36) -> None:
    """A smooth random texture moving STEP px a frame to the right, lossless (FFV1)."""
    rng = np.random.default_rng(5)
    texture = rng.integers(0, 255, (HEIGHT // 2, (WIDTH + STEP * frames) // 2 + 2, 3))
    texture = np.repeat(np.repeat(texture.astype(np.uint8), 2, axis=0), 2, axis=1)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("ffv1", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "bgr0"
        for i in range(frames):
            left = STEP * (frames - i)
            picture = np.ascontiguousarray(texture[:HEIGHT, left : left + WIDTH])
            for packet in stream.encode(av.VideoFrame.from_ndarray(picture, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def texture_picture(path: Path) -> None:
    """A detailed picture for the scene to be of: the procedural generator's own gradient
    and soft shapes have too little detail to measure a pan on."""
    rng = np.random.default_rng(9)
    small = rng.integers(0, 255, (HEIGHT // 4, WIDTH // 4, 3)).astype(np.uint8)
    Image.fromarray(small).resize((WIDTH, HEIGHT), Image.Resampling.BICUBIC).save(path)


def manifest(folder: Path, family: str = "procedural", strength: float = 1.0) -> Path:
    path = folder / "m.yaml"
    model = "procedural" if family == "procedural" else f"{{family: {family}, path: /models/x}}"
    segment = {"ltx-video": "{frames: 25, overlap: 9}", "skyreels-v2-df": "{frames: 21, overlap: 5}"
               }.get(family, "{frames: 24, overlap: 4}")  # fmt: skip
    path.write_text(
        f"batch: cam\nvideos:\n  - id: v\n    duration: 6\n    fps: {FPS}\n"
        f"    resolution: {WIDTH}x{HEIGHT}\n    segment: {segment}\n    renditions: [mobile]\n"
        f"    model: {model}\n    scenes:\n      - {{start: 0, prompt: a calm sea}}\n"
        "      - {start: 3, prompt: a harbor wall, join: cut, "
        "image: {asset: ./wall.png, as: reference}, "
        f"camera: {{asset: ./pan.mkv, strength: {strength}}}}}\n"
    )
    return path


@pytest.mark.parametrize("strength", [1.0, 0.5])
def test_the_procedural_generator_follows_the_template(tmp_path: Path, strength: float):
    pan_template(tmp_path / "pan.mkv")
    texture_picture(tmp_path / "wall.png")
    env = home_env(tmp_path / "home")
    done = run_cli_here("run", str(manifest(tmp_path, strength=strength)), env=env, timeout=600)
    status = run_cli_here("status", "cam.v", env=env).stdout
    assert done.returncode == 0, status
    assert "camera     scene 1: assets/sha256/" in status
    _, ctx = in_process(tmp_path / "home")
    job = ctx.machine.get("cam.v")
    assert job.stage is Stage.DONE, job.last_error
    made = Segments.load(ctx.machine, job)
    frames = np.concatenate([
        read_frames(ctx.store.path(made.segment(p.index)), WIDTH, HEIGHT)[: p.owned_count]
        for p in video_plan(job.video) if p.shot == 1 and p.owned_count
    ])  # fmt: skip
    track = motion_track(frames)
    # The scene is 3 s (36 frames) and so is the template: the content travels 35 x STEP
    # px to the right (x strength), and nowhere up or down. (The scene's own shapes drift
    # over the picture and it is pushed in slowly; the tolerance is theirs.)
    travelled = track[-1]
    assert abs(travelled[0] - 35 * STEP * strength) <= 0.15 * 35 * STEP, travelled
    assert abs(travelled[1]) <= 6, travelled


def test_a_family_without_control_and_a_bad_template_are_refused(tmp_path: Path):
    pan_template(tmp_path / "pan.mkv")
    texture_picture(tmp_path / "wall.png")
    env = home_env(tmp_path / "home")
    refused = run_cli_here("validate", str(manifest(tmp_path, "skyreels-v2-df")), env=env)
    assert refused.returncode == 2
    assert ("videos[0].scenes[1].camera: skyreels-v2-df cannot follow a camera move; families "
            "that can: procedural, wan, ltx-video") in refused.stderr  # fmt: skip
    (tmp_path / "pan.mkv").write_bytes(b"not a video")
    refused = run_cli_here("submit", str(manifest(tmp_path)), env=env)
    assert refused.returncode == 2
    assert "videos[0].scenes[1].camera.asset: ./pan.mkv is not a video file" in (refused.stderr)
    assert "no job" in run_cli_here("status", "cam.v", env=env).stderr
