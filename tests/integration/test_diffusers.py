"""The diffusers backend, offline on CPU, with tiny random components saved like a real model."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest

from factory.errors import PermanentError
from factory.generate import SegmentSpec, make_generator
from factory.generate.diffusers_backend import check_model_dir
from factory.manifest import parse_manifest
from factory.pipeline.generate import generate_segment
from factory.spec import ModelChoice
from factory.submit import submit
from tests.conftest import run_cli
from tests.integration.test_pipeline import home_env, in_process
from tests.tiny_models import save_skyreels_df


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_skyreels_df(tmp_path_factory.mktemp("models") / "skyreels-tiny")


def manifest(model_dir: Path, batch: str = "df") -> str:
    # 4 segments of 17 frames with 5 of overlap (both 4k+1): 17 + 3 x 12 = 53 frames at 8 fps.
    return (
        f"batch: {batch}\nvideos:\n  - id: chain\n    duration: {53 / 8}\n    fps: 8\n"
        "    resolution: 64x64\n    segment: {frames: 17, overlap: 5}\n"
        "    renditions: [mobile]\n"
        f"    model: {{family: skyreels-v2-df, path: {model_dir}, steps: 2, guidance: 6.0}}\n"
        "    scenes:\n      - {start: 0, prompt: 'a harbor at dawn with fog on the water'}\n"
        "      - {start: 3, prompt: 'boats leave the harbor and gulls fly'}\n"
    )


def test_a_four_segment_chain_goes_through_stitch_encode_and_qc(tmp_path: Path, model_dir: Path):
    path = tmp_path / "m.yaml"
    path.write_text(manifest(model_dir))
    env = home_env(tmp_path / "home")
    done = run_cli("run", str(path), env=env, timeout=900)
    assert done.returncode == 0, done.stderr + done.stdout
    factory, _ = in_process(tmp_path / "home")
    job = factory.jobs.get("df.chain")
    assert job.progress["segments"] == [0, 1, 2, 3] and job.progress["qc"]["passed"] is True
    assert (tmp_path / "home" / "store" / "df" / "chain" / "out" / "mobile.mp4").is_file()
    segments = [e for e in factory.jobs.events("df.chain") if e.event == "segment.done"]
    assert {e.detail["attention"] for e in segments} == {"native"}  # chosen and recorded
    assert "no CUDA" in segments[0].detail["attention_reason"]


def test_a_resumed_job_makes_the_same_frames(tmp_path: Path, model_dir: Path):
    digests = []
    for name, crash_after in (("whole", None), ("resumed", 2)):
        factory, ctx = in_process(tmp_path / name)
        job = submit(parse_manifest(manifest(model_dir)), factory.jobs, None).jobs[0]
        job = factory.jobs.claim(job.job_id, seen_attempt=job.attempt, worker="a")
        warm = None
        for index in range(4):
            if index == crash_after:  # a cold worker takes over: new generator, no warm tail
                _, ctx = in_process(tmp_path / name)
                job = factory.jobs.claim(job.job_id, seen_attempt=job.attempt, worker="b")
                warm = None
            job, warm = generate_segment(ctx, job, warm)
        segments = sorted((tmp_path / name / "store" / "df" / "chain" / "segments").glob("*.mkv"))
        digests.append([hashlib.sha256(p.read_bytes()).hexdigest() for p in segments])
    assert len(digests[0]) == 4 and digests[0] == digests[1]


def test_the_generator_continues_its_context(model_dir: Path):
    generator = make_generator(ModelChoice("skyreels-v2-df", str(model_dir), steps=2))
    generator.load("cpu")
    prompt = generator.encode_prompt("a forest in autumn with red leaves", "blurry")
    first = generator.generate(SegmentSpec(0, 17, 64, 64, 8, 0, 0), prompt, None, 1)
    assert first.shape == (17, 64, 64, 3) and first.dtype == np.uint8
    follow = generator.generate(SegmentSpec(1, 17, 64, 64, 8, 12, 5), prompt, first[-5:], 2)
    assert follow.shape == (17, 64, 64, 3)
    with pytest.raises(PermanentError, match="4k\\+1"):
        generator.generate(SegmentSpec(1, 17, 64, 64, 8, 12, 4), prompt, first[-4:], 2)


def test_a_missing_model_directory_is_a_clear_error(tmp_path: Path, model_dir: Path):
    with pytest.raises(PermanentError, match=r"missing model_index\.json"):
        check_model_dir(str(tmp_path / "nowhere"))
    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    shutil.rmtree(broken / "transformer")
    with pytest.raises(PermanentError, match="missing transformer"):
        check_model_dir(str(broken))
    path = tmp_path / "m.yaml"
    path.write_text(manifest(broken, batch="broken"))
    env = home_env(tmp_path / "home")
    failed = run_cli("run", str(path), env=env, timeout=300)
    assert failed.returncode == 1
    status = run_cli("status", "broken.chain", env=env).stdout
    assert "missing transformer" in status and "failed (in generate)" in status


def test_a_poisoned_model_fails_the_job_instead_of_making_a_video(tmp_path: Path, model_dir: Path):
    import torch
    from diffusers import SkyReelsV2Transformer3DModel

    poisoned = tmp_path / "poisoned"
    shutil.copytree(model_dir, poisoned)
    transformer = SkyReelsV2Transformer3DModel.from_pretrained(poisoned / "transformer")
    with torch.no_grad():
        transformer.proj_out.weight.fill_(float("nan"))
    transformer.save_pretrained(poisoned / "transformer")
    path = tmp_path / "m.yaml"
    path.write_text(manifest(poisoned, batch="nan"))
    env = home_env(tmp_path / "home")
    assert run_cli("run", str(path), env=env, timeout=300).returncode == 1
    status = run_cli("status", "nan.chain", env=env).stdout
    assert "BadOutput" in status and "NaN" in status and "failed (in generate)" in status
