"""The GPU check (scripts/gpu_check.sh): realistic-size random-initialised components built
from config (the Wan2.1 / SkyReels-V2 1.3B transformer and the Wan VAE; no text encoder, as
on a worker fed by the embedding cache), saved like a model directory and run through the
factory's own generator for a few chained segments with each available attention backend.
Prints seconds per segment and the memory table, and writes them as JSON.

`--tiny` runs the same path with tiny components on the CPU (the tests do, so the script
cannot rot between GPU sessions)."""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from factory.generate.attention import BACKENDS, Capabilities
from factory.generate.base import SegmentSpec, segment_seed
from factory.generate.diffusers_backend import SkyReelsDiffusionForcing
from factory.generate.memory_plan import WAN_13B as RELEASED_WAN_13B
from factory.generate.memory_plan import MemoryPlan, plan
from factory.spec import ModelChoice

WAN_13B = dict(RELEASED_WAN_13B, patch_size=(1, 2, 2))  # Wan2.1 / SkyReels-V2 1.3B
# The same architecture at a size a CPU makes a segment with in seconds.
TINY = dict(WAN_13B, num_attention_heads=2, attention_head_dim=12, text_dim=32, ffn_dim=32,
            num_layers=2, rope_max_seq_len=32)  # fmt: skip
TINY_VAE = dict(
    base_dim=3,
    z_dim=16,
    dim_mult=[1, 1, 1, 1],
    num_res_blocks=1,
    temperal_downsample=[False, True, True],
)


def build_model_dir(folder: Path, *, tiny: bool, device: str) -> Path:
    import torch
    from diffusers import (
        AutoencoderKLWan,
        SkyReelsV2DiffusionForcingPipeline,
        SkyReelsV2Transformer3DModel,
        UniPCMultistepScheduler,
    )

    torch.manual_seed(0)
    # Built and saved in float32: from_pretrained(dtype=bf16) then keeps the modules the model
    # wants in float32 (norms, rope, time embedding), as with released weights.
    with torch.device(device):
        transformer = SkyReelsV2Transformer3DModel(**(TINY if tiny else WAN_13B))
        vae = AutoencoderKLWan(**(TINY_VAE if tiny else {}))
    scheduler = UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=8.0
    )
    pipe = SkyReelsV2DiffusionForcingPipeline(
        tokenizer=None, text_encoder=None, vae=vae, transformer=transformer, scheduler=scheduler
    )
    pipe.save_pretrained(folder)
    del pipe, transformer, vae
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return folder


def available_backends(device: str) -> list[str]:
    caps = Capabilities.probe(device)
    found = ["native"]
    if caps.cuda and caps.flash_attn_2:
        found.insert(0, "flash")
    if caps.cuda and caps.flash_attn_3 and (caps.compute_capability or (0, 0)) >= (9, 0):
        found.insert(0, "_flash_3")
    return [b for b in BACKENDS if b in found]


def run_backend(
    model_dir: Path, backend: str, args: argparse.Namespace, text_dim: int
) -> dict[str, Any]:
    import torch

    model = ModelChoice("skyreels-v2-df", str(model_dir), steps=args.steps, guidance=5.0)
    generator = SkyReelsDiffusionForcing(model, attention_override=backend)
    started = time.perf_counter()
    generator.load(args.device)
    load_seconds = time.perf_counter() - started
    embeds = torch.Generator("cpu").manual_seed(0)
    tensors = {
        "prompt_embeds": torch.randn(1, 512, text_dim, generator=embeds),
        "negative_prompt_embeds": torch.randn(1, 512, text_dim, generator=embeds),
    }
    prompt = generator.embedding("gpu check", "", tensors)
    width, height = args.width, args.height
    frames, overlap = args.frames, args.overlap
    context = None
    segments = []
    for index in range(args.segments):
        seg = SegmentSpec(
            index, frames, width, height, 16, index * (frames - overlap), overlap if index else 0
        )
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        started = time.perf_counter()
        video = generator.generate(seg, prompt, context, segment_seed(7, index))
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        context = video
        segments.append(
            {"segment": index, "seconds": round(seconds, 3), "memory": generator.last_memory}
        )
        print(
            f"  {backend:9s} segment {index}: {seconds:7.2f} s, peak allocated "
            f"{_gib(generator.last_memory.get('peak_allocated'))}, reserved "
            f"{_gib(generator.last_memory.get('peak_reserved'))}",
            flush=True,
        )
        assert video.shape == (frames, height, width, 3) and np.isfinite(video).all()
    del generator
    gc.collect()
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    later = [s["seconds"] for s in segments[1:]] or [segments[0]["seconds"]]
    return {
        "backend": backend,
        "load_seconds": round(load_seconds, 2),
        "seconds_per_segment": round(float(np.median(later)), 3),
        "seconds_per_step": round(float(np.median(later)) / args.steps, 4),
        "segments": segments,
    }


def _gib(value: int | None) -> str:
    return "-" if value is None else f"{value / (1 << 30):.2f} GiB"


def check_parser(description: str, out: str, resolution: str) -> argparse.ArgumentParser:
    """The options every GPU check takes: --tiny, --device, --segments, --resolution, --out."""
    parser = argparse.ArgumentParser(description=description.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny components on the CPU")
    parser.add_argument("--device", default=None)
    parser.add_argument("--segments", type=int, default=3)
    parser.add_argument("--resolution", default=None, help=f"WIDTHxHEIGHT (default {resolution})")
    parser.add_argument("--out", type=Path, default=Path(out))
    return parser


def fill_device_and_size(args: argparse.Namespace, *, tiny: str, full: str) -> str:
    """The device (the CPU with --tiny, else CUDA) and width/height from --resolution or the
    default for the run's size; gives the resolution as written."""
    args.device = args.device or ("cpu" if args.tiny else "cuda")
    resolution = args.resolution or (tiny if args.tiny else full)
    args.width, args.height = (int(v) for v in resolution.split("x"))
    return resolution


def _arguments(argv: list[str] | None) -> tuple[argparse.Namespace, str]:
    """Parse the command line and fill in the defaults (smaller ones with --tiny); gives the
    arguments and the resolution as written."""
    parser = check_parser(__doc__, "gpu_check.json", "832x480")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--frames", type=int, default=None, help="frames per segment (4k+1)")
    parser.add_argument("--overlap", type=int, default=None)
    parser.add_argument("--backends", default=None, help="comma-separated; default: available")
    args = parser.parse_args(argv)
    resolution = fill_device_and_size(args, tiny="64x64", full="832x480")
    args.frames = args.frames or (17 if args.tiny else 33)
    args.overlap = args.overlap or (5 if args.tiny else 9)
    args.steps = 2 if args.tiny and args.steps == 10 else args.steps
    return args, resolution


def _print_results(results: list[dict[str, Any]], estimate: MemoryPlan) -> None:
    """Print the table of backends (time and memory) and the memory plan beside it."""
    print()
    header = (
        f"{'backend':10s} {'s/segment':>10s} {'s/step':>8s} {'peak alloc':>12s} "
        f"{'reserved':>12s} {'fragment.':>10s} {'load s':>7s}"
    )
    print(header)
    for r in results:
        last = r["segments"][-1]["memory"]
        frag = last.get("fragmentation")
        print(
            f"{r['backend']:10s} {r['seconds_per_segment']:10.2f} {r['seconds_per_step']:8.3f} "
            f"{_gib(max_of(r, 'peak_allocated')):>12s} {_gib(max_of(r, 'peak_reserved')):>12s} "
            f"{'-' if frag is None else f'{frag:.1%}':>10s} {r['load_seconds']:7.1f}"
        )
    print(f"\nplan (factory gpu plan) for comparison: {_gib(estimate.gpu_total)} on the GPU")
    for line in estimate.lines:
        print(f"  {line.component:28s} {_gib(line.bytes):>10s}  {line.how}")


def main(argv: list[str] | None = None) -> int:
    args, resolution = _arguments(argv)
    backends = args.backends.split(",") if args.backends else available_backends(args.device)
    print(
        f"gpu check: {'tiny' if args.tiny else 'Wan2.1 1.3B-size'} components on "
        f"{args.device}, {resolution}, {args.segments} segments of {args.frames} frames "
        f"(overlap {args.overlap}), {args.steps} steps; backends {', '.join(backends)}",
        flush=True,
    )
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        model_dir = build_model_dir(Path(scratch) / "model", tiny=args.tiny, device=args.device)
        print(
            f"built and saved the components in {time.perf_counter() - started:.1f} s", flush=True
        )
        text_dim = (TINY if args.tiny else WAN_13B)["text_dim"]
        results = [run_backend(model_dir, b, args, text_dim) for b in backends]  # type: ignore[arg-type]
        estimate = plan("skyreels-v2-df", args.width, args.height, args.frames, str(model_dir))
    _print_results(results, estimate)
    report = {
        "device": args.device,
        "tiny": args.tiny,
        "resolution": resolution,
        "frames": args.frames,
        "overlap": args.overlap,
        "steps": args.steps,
        "results": results,
        "plan": estimate.to_dict(),
        "wall_seconds": round(time.perf_counter() - started, 1),
    }
    if args.device.startswith("cuda"):
        import torch

        report["gpu"] = torch.cuda.get_device_name()
    args.out.write_text(json.dumps(report, indent=2))
    print(f"\nwrote {args.out} ({report['wall_seconds']} s in all)")
    return 0


def max_of(result: dict[str, Any], key: str) -> int | None:
    values = [s["memory"].get(key) for s in result["segments"]]
    present = [v for v in values if v is not None]
    return max(present) if present else None


if __name__ == "__main__":
    raise SystemExit(main())
