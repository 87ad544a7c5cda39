"""The diffusers backends, offline on CPU, with tiny random components saved like real models:
every family chained over 4 segments, resumed exactly, fed by the embedding cache without
the text encoder, with memory recorded, out-of-memory retried and bad output refused."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from factory.errors import PermanentError
from factory.generate import MemoryPolicy, SegmentSpec, make_generator, text_encoding
from factory.generate.diffusers_backend import check_model_dir
from factory.job import Job
from factory.manifest import parse_manifest
from factory.ops.submit import submit
from factory.pipeline.generate import generate_segment
from factory.spec import ModelChoice
from factory.store import keys
from factory.wiring import Factory
from tests.conftest import REPO, run_cli_here
from tests.integration.test_pipeline import home_env as plain_home_env
from tests.integration.test_pipeline import in_process
from tests.tiny_models import SAVERS

FAMILIES = list(SAVERS)
# Segment shapes every family accepts: overlap 4k+1 (Wan VAE) and 8k+1 (LTX VAE) frames.
SHAPES = {"skyreels-v2-df": (17, 5), "wan": (17, 5), "ltx-video": (25, 9)}


@pytest.fixture(scope="module")
def model_dirs(tiny_model) -> dict[str, Path]:
    return {family: tiny_model(family) for family in SAVERS}


# Random weights make noise-like pictures with no continuity from segment to segment: the
# gate's drift limits and fidelity floors are set for real models (noise is the hardest
# thing to encode), so these runs loosen them; everything else is judged as usual.
RANDOM_MODEL_QC = {
    "FACTORY_QC_DRIFT_DELTA_E": "1000",
    "FACTORY_QC_DRIFT_DELTA_L": "1000",
    "FACTORY_QC_DRIFT_CONTRAST": "1000",
    "FACTORY_QC_MIN_PSNR": "20",
    "FACTORY_QC_MIN_VMAF": "40",
    "FACTORY_QC_MIN_SSIM": "0.5",
}


def home_env(home: Path) -> dict[str, str]:
    return {**plain_home_env(home), **RANDOM_MODEL_QC}


def manifest(model_dir: Path, family: str = "skyreels-v2-df", batch: str = "df") -> str:
    frames, overlap = SHAPES[family]
    total = frames + 3 * (frames - overlap)  # 4 segments
    return (
        f"batch: {batch}\nvideos:\n  - id: chain\n    duration: {total / 8}\n    fps: 8\n"
        f"    resolution: 64x64\n    segment: {{frames: {frames}, overlap: {overlap}}}\n"
        "    renditions: [mobile]\n    negative_prompt: blurry low quality flicker\n"
        f"    model: {{family: {family}, path: {model_dir}, steps: 2, guidance: 6.0}}\n"
        "    scenes:\n      - {start: 0, prompt: 'a harbor at dawn with fog on the water'}\n"
        "      - {start: 3, prompt: 'boats leave the harbor and gulls fly'}\n"
    )


def segment_digests(home: Path, batch: str) -> list[str]:
    segments = sorted((home / "store" / batch / "chain" / "segments").glob("*.mkv"))
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in segments]


def run_chain(tmp_path: Path, text: str, job_id: str) -> tuple[Factory, Job, dict[str, str]]:
    """`factory run` of the manifest TEXT in a fresh home below TMP_PATH: the job JOB_ID went
    through all 4 of its segments and passed QC. The factory, the job and the env it ran in."""
    path = tmp_path / "m.yaml"
    path.write_text(text)
    env = home_env(tmp_path / "home")
    done = run_cli_here("run", str(path), env=env, timeout=900)
    assert done.returncode == 0, done.stderr + done.stdout
    factory, _ = in_process(tmp_path / "home")
    job = factory.jobs.get(job_id)
    assert job.progress["segments"] == [0, 1, 2, 3] and job.progress["qc"]["passed"] is True
    return factory, job, env


def resumed_digests(tmp_path: Path, text: str) -> list[list[str]]:
    """The segment digests of the manifest TEXT (batch df), made twice: by one worker, and
    with a cold worker taking over at segment 2 (a new generator, no warm tail: what it
    continues from comes from the store)."""
    digests = []
    for name, crash_after in (("whole", None), ("resumed", 2)):
        factory, ctx = in_process(tmp_path / name)
        job = submit(parse_manifest(text), factory.jobs, None).jobs[0]
        job = factory.jobs.claim(job.job_id, seen_attempt=job.attempt, worker="a")
        warm = None
        for index in range(4):
            if index == crash_after:
                _, ctx = in_process(tmp_path / name)
                job = factory.jobs.claim(job.job_id, seen_attempt=job.attempt, worker="b")
                warm = None
            job, warm = generate_segment(ctx, job, warm)
        digests.append(segment_digests(tmp_path / name, "df"))
    return digests


@pytest.mark.parametrize("family", FAMILIES)
def test_a_four_segment_chain_goes_through_stitch_encode_and_qc(
    tmp_path: Path, model_dirs: dict[str, Path], family: str
):
    factory, job, env = run_chain(tmp_path, manifest(model_dirs[family], family), "df.chain")
    assert (tmp_path / "home" / "store" / "df" / "chain" / "out" / "mobile.mp4").is_file()
    segments = [e for e in factory.jobs.events("df.chain") if e.event == "segment.done"]
    assert {e.detail["attention"] for e in segments} == {"native"}  # chosen and recorded
    assert "no CUDA" in segments[0].detail["attention_reason"]
    # The two scene prompts were encoded once, before the first segment, by the text encoder.
    assert segments[0].detail["prompt_cache"] == {"hits": 0, "misses": 2}
    assert all("prompt_cache" not in e.detail for e in segments[1:])
    memory = {str(i): r.memory for i, r in factory.jobs.segments(job.job_id).items()}
    assert sorted(memory) == ["0", "1", "2", "3"]
    assert {m["device"] for m in memory.values()} == {"cpu"}
    assert all(m["peak_rss"] > 0 and m["oom_retries"] == 0 for m in memory.values())
    report = json.loads(run_cli_here("gpu", "report", "--json", env=env).stdout)
    [row] = report["segments"]
    assert (row["family"], row["segments"], row["resolution"]) == (family, 4, "64x64")
    assert report["embedding_cache"]["entries"] == 2


@pytest.mark.parametrize("family", FAMILIES)
def test_a_resumed_job_makes_the_same_frames(
    tmp_path: Path, model_dirs: dict[str, Path], family: str
):
    digests = resumed_digests(tmp_path, manifest(model_dirs[family], family))
    assert len(digests[0]) == 4 and digests[0] == digests[1]


def test_a_cache_hit_never_loads_or_calls_the_text_encoder(
    tmp_path: Path, model_dirs: dict[str, Path]
):
    model_dir = tmp_path / "model"
    shutil.copytree(model_dirs["wan"], model_dir)
    path = tmp_path / "m.yaml"
    path.write_text(manifest(model_dir, "wan"))
    env = home_env(tmp_path / "home")
    first = run_cli_here("preload", str(path), env=env, timeout=300)
    assert first.returncode == 0, first.stderr
    assert "2 prompts, 0 already cached, 2 encoded" in first.stdout
    # Without its weights the text encoder cannot load: generation must not need it.
    for weights in (model_dir / "text_encoder").glob("*.safetensors"):
        weights.unlink()
    loads_before = text_encoding.loads
    factory, ctx = in_process(tmp_path / "home")
    job = submit(parse_manifest(manifest(model_dir, "wan")), factory.jobs, None).jobs[0]
    job = factory.jobs.claim(job.job_id, seen_attempt=job.attempt, worker="a")
    job, _ = generate_segment(ctx, job, None)
    assert text_encoding.loads == loads_before
    done = run_cli_here("run", str(path), env=env, timeout=600)
    assert done.returncode == 0, done.stderr + done.stdout
    second = json.loads(run_cli_here("preload", str(path), "--json", env=env).stdout)
    embeddings = second["embeddings"]
    assert (embeddings["hits"], embeddings["misses"]) == (2, 0)
    assert embeddings["cache"]["hits"] == 3 and embeddings["cache"]["hit_rate"] > 0.5
    events = factory.jobs.events("df.chain")
    first_segment = next(e for e in events if e.event == "segment.done")
    assert first_segment.detail["prompt_cache"] == {"hits": 2, "misses": 0}


def test_cached_embeddings_make_the_same_frames_as_direct_encoding(
    tmp_path: Path, model_dirs: dict[str, Path]
):
    digests = []
    for name, cache in (("cached", "store"), ("direct", "off")):
        env = {**home_env(tmp_path / name), "FACTORY_EMBEDDING_CACHE": cache}
        path = tmp_path / f"{name}.yaml"
        path.write_text(manifest(model_dirs["skyreels-v2-df"]))
        assert run_cli_here("run", str(path), env=env, timeout=600).returncode == 0
        digests.append(segment_digests(tmp_path / name, "df"))
    assert digests[0] == digests[1]


def test_the_generator_continues_its_context(model_dirs: dict[str, Path]):
    generator = make_generator(
        ModelChoice("skyreels-v2-df", str(model_dirs["skyreels-v2-df"]), steps=2)
    )
    generator.load("cpu")
    prompt = generator.encode_prompt("a forest in autumn with red leaves", "blurry")
    first = generator.generate(SegmentSpec(0, 17, 64, 64, 8, 0, 0), prompt, None, 1)
    assert first.shape == (17, 64, 64, 3) and first.dtype == np.uint8
    follow = generator.generate(SegmentSpec(1, 17, 64, 64, 8, 12, 5), prompt, first[-5:], 2)
    assert follow.shape == (17, 64, 64, 3)
    with pytest.raises(PermanentError, match="4k\\+1"):
        generator.generate(SegmentSpec(1, 17, 64, 64, 8, 12, 4), prompt, first[-4:], 2)


def _loaded(model_dir: Path, policy: MemoryPolicy | None = None, family: str = "skyreels-v2-df"):
    generator = make_generator(ModelChoice(family, str(model_dir), steps=2), memory_policy=policy)
    generator.load("cpu")
    return generator, generator.encode_prompt("a harbor at dawn with fog on the water", "")


def test_out_of_memory_is_retried_once_with_tiling_then_fails_clearly(
    model_dirs: dict[str, Path],
):
    import torch

    generator, prompt = _loaded(model_dirs["skyreels-v2-df"])
    vae = generator.pipe.vae
    real_decode = vae.decode
    failures = {"left": 1}

    def decode_that_runs_out(*args, **kwargs):  # a real OOM needs a GPU; this is its exception
        if failures["left"]:
            failures["left"] -= 1
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return real_decode(*args, **kwargs)

    vae.decode = decode_that_runs_out
    frames = generator.generate(SegmentSpec(0, 17, 64, 64, 8, 0, 0), prompt, None, 3)
    assert frames.shape == (17, 64, 64, 3)
    assert generator.last_memory["oom_retries"] == 1 and vae.use_tiling
    failures["left"] = 2
    with pytest.raises(PermanentError, match="out of GPU memory at 64x64, 17 frames"):
        generator.generate(SegmentSpec(0, 17, 64, 64, 8, 0, 0), prompt, None, 3)


def test_group_offload_gives_the_same_frames_and_fp8_casting_runs(model_dirs: dict[str, Path]):
    spec = SegmentSpec(0, 17, 64, 64, 8, 0, 0)
    plain, prompt = _loaded(model_dirs["wan"], family="wan")
    offloaded, _ = _loaded(model_dirs["wan"], MemoryPolicy(group_offload="block"), "wan")
    assert np.array_equal(
        plain.generate(spec, prompt, None, 5), offloaded.generate(spec, prompt, None, 5)
    )
    assert offloaded.last_memory["group_offload"] == "block"
    cast, _ = _loaded(
        model_dirs["wan"], MemoryPolicy(layerwise_casting="fp8", vae_tiling=True), "wan"
    )
    assert cast.generate(spec, prompt, None, 5).shape == (17, 64, 64, 3)
    assert cast.pipe.vae.use_tiling and cast.last_memory["layerwise_casting"] == "fp8"


def test_memory_settings_reach_the_worker_and_are_recorded(
    tmp_path: Path, model_dirs: dict[str, Path]
):
    env = {
        **home_env(tmp_path / "home"),
        "FACTORY_GROUP_OFFLOAD": "block",
        "FACTORY_VAE_TILING": "1",
    }
    path = tmp_path / "m.yaml"
    path.write_text(manifest(model_dirs["skyreels-v2-df"]))
    assert run_cli_here("run", str(path), env=env, timeout=600).returncode == 0
    status = json.loads(run_cli_here("status", "df.chain", "--json", env=env).stdout)
    recorded = status["segments_made"][0]["memory"]
    assert recorded["group_offload"] == "block" and recorded["vae_tiling"] is True
    bad = run_cli_here("run", str(path), env={**env, "FACTORY_GROUP_OFFLOAD": "half"})
    assert bad.returncode == 2 and "FACTORY_GROUP_OFFLOAD" in bad.stderr


def test_gpu_plan_counts_weights_exactly_and_scales_with_resolution(
    tmp_path: Path, model_dirs: dict[str, Path]
):
    from diffusers import WanVACETransformer3DModel

    env = home_env(tmp_path / "home")

    def planned(*extra: str) -> dict:
        done = run_cli_here(
            "gpu", "plan", "--family", "wan", "--segment-frames", "33", "--json", *extra, env=env
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    tiny = planned("--resolution", "64x64", "--model", str(model_dirs["wan"]))
    weights = next(c for c in tiny["components"] if c["component"] == "transformer weights")
    transformer = WanVACETransformer3DModel.from_pretrained(model_dirs["wan"] / "transformer")
    assert weights["bytes"] == 2 * sum(p.numel() for p in transformer.parameters())
    small, large = planned("--resolution", "480x272"), planned("--resolution", "832x480")
    assert large["tokens"] > small["tokens"] and large["gpu_total"] > small["gpu_total"]
    released = next(c for c in large["components"] if c["component"] == "transformer weights")
    assert 3.5 * 2**30 < released["bytes"] < 4.5 * 2**30  # Wan2.1-VACE 1.3B in bf16
    encoder = next(c for c in large["components"] if c["component"].startswith("text"))
    assert encoder["on_gpu"] is False  # the embedding cache keeps it off the GPU
    # What a scene brings costs memory: two VACE reference pictures are two more latent
    # frames of tokens and their encodes; a camera move's control frames are encoded too.
    brought = planned("--resolution", "832x480", "--reference-images", "2", "--control")
    per_latent = (480 // 8 // 2) * (832 // 8 // 2)
    assert brought["tokens"] == large["tokens"] + 2 * per_latent
    names = {c["component"] for c in brought["components"]}
    assert {"reference pictures x2 (VAE encode)", "camera move (control frames, VAE encode)"
            } <= names and brought["gpu_total"] > large["gpu_total"]  # fmt: skip
    refused = run_cli_here("gpu", "plan", "--family", "ltx-video", "--resolution",
                           "832x480", "--segment-frames", "33", "--reference-images", "1",
                           env=env)  # fmt: skip
    assert refused.returncode == 2 and "--reference-images" in refused.stderr
    bad = run_cli_here(
        "gpu",
        "plan",
        "--family",
        "wan",
        "--resolution",
        "830x480",
        "--segment-frames",
        "33",
        env=env,
    )
    assert bad.returncode == 2 and "multiples of 16" in bad.stderr


def test_the_gpu_check_script_runs_its_tiny_form(tmp_path: Path):
    out = tmp_path / "check.json"
    done = run_cli_script(
        [
            "bash",
            str(REPO / "scripts" / "gpu_check.sh"),
            "--tiny",
            "--segments",
            "2",
            "--out",
            str(out),
        ],
        env={"OUT": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr
    assert "s/segment" in done.stdout
    report = json.loads(out.read_text())
    assert [r["backend"] for r in report["results"]] == ["native"]
    assert len(report["results"][0]["segments"]) == 2
    # The latent families' real-size check, in its tiny form: factory vs bare, seams, per family.
    latent = json.loads((tmp_path / "gpu_check_latent.json").read_text())
    assert sorted(latent["families"]) == ["anyflow-far", "helios"]
    for rows in latent["families"].values():
        [row] = rows
        assert row["factory"]["frames"] > 0 and row["bare"]["frames_per_second"] > 0
        assert len(row["factory"]["joins"]) == 2 and row["factory_over_bare"] > 0


def run_cli_script(argv: list[str], env: dict[str, str] | None = None):
    import os
    import subprocess

    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def test_a_missing_model_directory_is_a_clear_error(tmp_path: Path, model_dirs: dict[str, Path]):
    with pytest.raises(PermanentError, match=r"nowhere does not exist"):
        check_model_dir(str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(PermanentError, match=r"missing model_index\.json"):
        check_model_dir(str(tmp_path / "empty"))
    broken = tmp_path / "broken"
    shutil.copytree(model_dirs["skyreels-v2-df"], broken)
    shutil.rmtree(broken / "transformer")
    with pytest.raises(PermanentError, match="missing transformer"):
        check_model_dir(str(broken))
    # visible from the submitting host: refused before any job exists
    path = tmp_path / "m.yaml"
    path.write_text(manifest(broken, batch="broken"))
    env = home_env(tmp_path / "home")
    refused = run_cli_here("run", str(path), env=env, timeout=300)
    assert refused.returncode == 2, refused.stderr
    assert "videos[0].model.path: missing transformer" in refused.stderr
    assert "no job" in run_cli_here("status", "broken.chain", env=env).stderr


def test_a_model_directory_not_visible_at_submit_is_checked_by_the_worker(tmp_path: Path):
    elsewhere = "/gpu-node-only-models/SkyReels-V2-DF-1.3B"  # nothing of it on this host
    path = tmp_path / "m.yaml"
    path.write_text(manifest(Path(elsewhere), batch="remote"))
    env = home_env(tmp_path / "home")
    failed = run_cli_here("run", str(path), env=env, timeout=300)
    assert "is not visible from this host" in failed.stderr
    assert failed.returncode == 1
    status = " ".join(run_cli_here("status", "remote.chain", env=env).stdout.split())
    assert f"model directory {elsewhere} does not exist on this host" in status
    assert "failed (in generate)" in status


def test_a_poisoned_model_fails_the_job_instead_of_making_a_video(
    tmp_path: Path, model_dirs: dict[str, Path]
):
    import torch
    from diffusers import SkyReelsV2Transformer3DModel

    poisoned = tmp_path / "poisoned"
    shutil.copytree(model_dirs["skyreels-v2-df"], poisoned)
    transformer = SkyReelsV2Transformer3DModel.from_pretrained(poisoned / "transformer")
    with torch.no_grad():
        transformer.proj_out.weight.fill_(float("nan"))
    transformer.save_pretrained(poisoned / "transformer")
    path = tmp_path / "m.yaml"
    path.write_text(manifest(poisoned, batch="nan"))
    env = home_env(tmp_path / "home")
    assert run_cli_here("run", str(path), env=env, timeout=300).returncode == 1
    status = run_cli_here("status", "nan.chain", env=env).stdout
    assert "BadOutput" in status and "NaN" in status and "failed (in generate)" in status


def test_a_redo_with_a_new_prompt_through_a_diffusers_family(
    tmp_path: Path, model_dirs: dict[str, Path]
):
    """`factory redo --prompt` on a real (tiny) diffusers pipeline: the redone segment is
    made from the new prompt's embedding (through the cache: one more entry), continues from
    the stored tail of the segment before it, joins into the kept next one, and version 2
    is delivered beside version 1 with every other segment's frames as they were."""
    path = tmp_path / "m.yaml"
    path.write_text(manifest(model_dirs["skyreels-v2-df"], batch="re"))
    env = home_env(tmp_path / "home")
    assert run_cli_here("run", str(path), env=env, timeout=900).returncode == 0
    store = tmp_path / "home" / "store"
    factory, _ = in_process(tmp_path / "home")
    v1 = factory.jobs.segments("re.chain")
    before = {i: (store / keys.segment("re", "chain", i, r.attempt)).read_bytes()
              for i, r in v1.items()}  # fmt: skip
    entries = json.loads(run_cli_here("gpu", "report", "--json", env=env).stdout)
    assert entries["embedding_cache"]["entries"] == 2

    plan = json.loads(run_cli_here("redo", "re.chain", "--range", "2.2-3.0", "--dry-run", "--json",
                              env=env).stdout)  # fmt: skip
    assert (plan["segments"], plan["join"]) == ([1], 2)
    prompt = "a red lighthouse in a storm at night"
    done = run_cli_here("redo", "re.chain", "--range", "2.2-3.0", "--prompt", prompt, env=env,
                   timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    job = factory.jobs.get("re.chain")
    assert job.version == 2
    assert job.progress["prompts"] == [[1, 2, prompt]]
    report = json.loads(run_cli_here("gpu", "report", "--json", env=env).stdout)
    assert report["embedding_cache"]["entries"] == 3  # the new prompt, encoded once
    records = factory.jobs.segments("re.chain")
    assert records[1].attempt == records[2].attempt == job.attempt  # made again, joined
    after = {i: (store / keys.segment("re", "chain", i, r.attempt)).read_bytes()
             for i, r in records.items()}  # fmt: skip
    assert after[0] == before[0] and after[3] == before[3]  # untouched, the same files
    assert after[1] != before[1] and after[2] != before[2]  # the new prompt, and the join
    for version in ("out", "v2/out"):
        assert (store / "re" / "chain" / version / "mobile.mp4").is_file()
    planned = next(e for e in factory.jobs.events("re.chain") if e.event == "redo.planned")
    assert planned.detail["prompt"] == prompt
