"""LoRAs named in the manifest: fetched through the node's asset cache, loaded once per
worker process as adapters over the base weights, weighted per job, and switched off for the
next job that does not name them. Offline on CPU with the tiny Wan VACE model."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from factory.errors import PermanentError
from factory.manifest import parse_manifest
from factory.ops.submit import submit
from factory.pipeline.files import Segments
from factory.pipeline.generate import generate_segment
from tests.integration.test_pipeline import in_process
from tests.tiny_models import save_lora


@pytest.fixture(scope="module")
def model_dir(tiny_model) -> Path:
    return tiny_model("wan")


def manifest(model_dir: Path, batch: str, lora: str = "") -> str:
    return (
        f"batch: {batch}\nvideos:\n  - id: clip\n    duration: 2.125\n    fps: 8\n"
        "    resolution: 64x64\n    segment: {frames: 17, overlap: 5}\n"
        "    renditions: [mobile]\n"
        f"    model: {{family: wan, path: {model_dir}, steps: 2, guidance: 6.0{lora}}}\n"
        "    prompt: 'a harbor at dawn with fog on the water'\n"
    )


def first_segment(ctx, factory, text: str) -> tuple[str, dict]:
    """Generate segment 0 of the manifest's job; its sha256 and its segment.done event."""
    job = submit(parse_manifest(text), factory.jobs, None).jobs[0]
    job = factory.jobs.claim(job.job_id, seen_attempt=job.attempt, worker="t")
    job, _ = generate_segment(ctx, job, None)
    with ctx.store.local_path(Segments.load(factory.jobs, job).segment(0)) as path:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    done = [e for e in factory.jobs.events(job.job_id) if e.event == "segment.done"][-1]
    return digest, done.detail


def test_a_lora_changes_the_pictures_by_its_scale_and_is_switched_off_after(
    tmp_path: Path, model_dir: Path
):
    factory, ctx = in_process(tmp_path / "home")
    save_lora(model_dir, "wan", tmp_path / "home" / "store" / "loras" / "style.safetensors")
    style = "loras/style.safetensors"
    base, base_event = first_segment(ctx, factory, manifest(model_dir, "base"))
    styled, event = first_segment(
        ctx, factory, manifest(model_dir, "styled", f", lora: [{{asset: {style}}}]")
    )
    zero, _ = first_segment(
        ctx, factory, manifest(model_dir, "zero", f", lora: [{{asset: {style}, scale: 0}}]")
    )
    after, after_event = first_segment(ctx, factory, manifest(model_dir, "after"))
    assert styled != base  # the adapter is applied
    assert zero == base  # weighted to nothing it is exactly the base model
    assert after == base  # the next job without it gets the base model back
    assert event["loras"] == [{"asset": style, "scale": 1.0}]
    assert "loras" not in base_event and "loras" not in after_event
    generator = next(iter(ctx._generators.values()))
    assert list(generator._adapters) == [style]  # loaded once, kept for later jobs
    assert len(ctx._generators) == 1  # the base weights were not loaded twice


def test_the_same_lora_job_resumed_elsewhere_makes_the_same_frames(tmp_path: Path, model_dir: Path):
    lora_path = save_lora(model_dir, "wan", tmp_path / "style.safetensors")
    text = manifest(model_dir, "again", f", lora: [{{asset: '{lora_path.as_uri()}', scale: 0.7}}]")
    digests = []
    for name in ("one", "two"):
        factory, ctx = in_process(tmp_path / name)
        digests.append(first_segment(ctx, factory, text)[0])
    assert digests[0] == digests[1]


def test_a_lora_for_another_model_is_a_clear_permanent_error(tmp_path: Path, model_dir: Path):
    factory, ctx = in_process(tmp_path / "home")
    junk = tmp_path / "home" / "store" / "loras" / "junk.safetensors"
    junk.parent.mkdir(parents=True)
    from safetensors.numpy import save_file

    save_file({"unrelated.lora_A.weight": np.zeros((4, 7), np.float32)}, str(junk))
    text = manifest(model_dir, "junk", ", lora: [{asset: loras/junk.safetensors}]")
    with pytest.raises(PermanentError, match=r"LoRA loras/junk\.safetensors does not fit"):
        first_segment(ctx, factory, text)


def test_preload_warms_the_loras_a_manifest_names(tmp_path: Path, model_dir: Path):
    import json

    from tests.conftest import embedded_env, run_cli

    lora_path = save_lora(model_dir, "wan", tmp_path / "ink.safetensors")
    path = tmp_path / "m.yaml"
    path.write_text(manifest(model_dir, "warm", f", lora: [{{asset: '{lora_path.as_uri()}'}}]"))
    env = {**embedded_env(tmp_path / "home"), "FACTORY_EMBEDDING_CACHE": "off"}
    done = run_cli("preload", str(path), "--json", env=env)
    assert done.returncode == 0, done.stderr
    assets = json.loads(done.stdout)["assets"]
    assert [(i["asset"], i["outcome"]) for i in assets["items"]] == [
        (lora_path.as_uri(), "fetched")
    ]
    assert assets["cache"]["bytes"] == lora_path.stat().st_size


class _Planted:
    """Unpickling this creates a file: proof that a loader ran pickle on the LoRA."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (Path.touch, (self.marker,))


def test_a_pickle_posing_as_a_lora_is_refused_and_never_unpickled(tmp_path: Path, model_dir: Path):
    import torch

    factory, ctx = in_process(tmp_path / "home")
    planted = tmp_path / "home" / "store" / "loras" / "planted.safetensors"
    planted.parent.mkdir(parents=True)
    marker = tmp_path / "unpickled"
    torch.save({"transformer.x.lora_A.weight": _Planted(marker)}, planted)
    text = manifest(model_dir, "planted", ", lora: [{asset: loras/planted.safetensors}]")
    with pytest.raises(PermanentError, match=r"LoRA loras/planted\.safetensors does not fit"):
        first_segment(ctx, factory, text)
    assert not marker.exists()  # loaded as safetensors only: the pickle was never run
