"""The GPU check of the latent families (scripts/gpu_check.sh runs it after the Wan check):
Helios-Distilled 14B and AnyFlow-FAR 1.3B at real size with random weights built from their
configs in memory (never downloaded; too large to save and load again, so the factory's
generator adopts the built pipeline), a few chained segments through the factory's own
segment path (latents continued from the carry, warm decode, stitch) per attention backend,
then one bare pipeline call of the same frames. Prints frames per second of GPU time for
both, their ratio, peak allocated and reserved memory, and the seam scores at the joins
against those inside segments; writes them as JSON.

`--tiny` runs the same path with tiny components on the CPU (the tests do)."""

from __future__ import annotations

import argparse
import gc
import json
import time
from typing import Any

import numpy as np

from factory.generate.base import SegmentSpec, segment_seed
from factory.generate.families import family_of
from factory.generate.latent_backend import AnyFlowFar, Helios, LatentGenerator
from factory.media.stitch import stitch
from factory.plan.segments import plan_segments
from factory.spec import ModelChoice

TINY_HELIOS = dict(num_attention_heads=2, attention_head_dim=12, text_dim=32, ffn_dim=32,
                   num_layers=1, rope_dim=(4, 4, 4))  # fmt: skip
TINY_FAR = dict(compressed_patch_size=(1, 4, 4), num_attention_heads=2, attention_head_dim=12,
                text_dim=32, freq_dim=32, ffn_dim=32, num_layers=1, rope_max_seq_len=64,
                chunk_partition=(1, 3, 3, 3, 3, 3, 3, 2))  # fmt: skip
FAR_13B = dict(num_attention_heads=12, attention_head_dim=128, ffn_dim=8960, num_layers=30,
               chunk_partition=(1, 3, 3, 3, 3, 3, 3, 2))  # fmt: skip
TINY_VAE = dict(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                temperal_downsample=[False, True, True])  # fmt: skip


def build(family: str, *, tiny: bool, device: str) -> Any:
    """The pipeline, random-initialised from the released configs (or tiny ones), in bf16 on a
    GPU with the modules diffusers keeps in float32 kept there."""
    import torch
    from diffusers import (
        AnyFlowFARPipeline,
        AnyFlowFARTransformer3DModel,
        AutoencoderKLWan,
        FlowMapEulerDiscreteScheduler,
        HeliosDMDScheduler,
        HeliosPyramidPipeline,
        HeliosTransformer3DModel,
    )

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            if family == "helios":
                transformer = HeliosTransformer3DModel(**(TINY_HELIOS if tiny else {}))
            else:
                transformer = AnyFlowFARTransformer3DModel(**(TINY_FAR if tiny else FAR_13B))
            vae = AutoencoderKLWan(**(TINY_VAE if tiny else {}))
    finally:
        torch.set_default_dtype(previous)
    vae.to(torch.float32)  # the model cards load the Wan VAE in float32
    for name in getattr(transformer, "_keep_in_fp32_modules", None) or ():
        for module_name, module in transformer.named_modules():
            if module_name.split(".")[-1] == name:
                module.to(torch.float32)
    if family == "helios":
        scheduler = HeliosDMDScheduler(stages=3, gamma=0.25 if tiny else 1 / 3,
                                       use_dynamic_shifting=True)  # fmt: skip
        return HeliosPyramidPipeline(tokenizer=None, text_encoder=None, vae=vae,
                                     transformer=transformer, scheduler=scheduler,
                                     is_distilled=True)  # fmt: skip
    return AnyFlowFARPipeline(tokenizer=None, text_encoder=None, vae=vae, transformer=transformer,
                              scheduler=FlowMapEulerDiscreteScheduler(shift=5.0))  # fmt: skip


def generator_for(family: str, pipe: Any, device: str, steps: int, backend: str) -> LatentGenerator:
    model = ModelChoice(family, "/gpu-check/in-memory", steps=steps)
    generator: LatentGenerator = Helios(model) if family == "helios" else AnyFlowFar(model)
    if family == "helios":
        generator.variant = "distilled"  # type: ignore[attr-defined]
    generator.adopt(pipe, device)
    if family == "helios":
        pipe.transformer.set_attention_backend(backend)
        generator.attention = (backend, "gpu check")
    return generator


def embeddings(pipe: Any) -> dict[str, Any]:
    import torch

    width = pipe.transformer.config.text_dim
    random = torch.Generator("cpu").manual_seed(0)
    return {
        "prompt_embeds": torch.randn(1, 512, width, generator=random),
        "negative_prompt_embeds": torch.randn(1, 512, width, generator=random),
    }


def run_factory(generator: LatentGenerator, args: argparse.Namespace) -> dict[str, Any]:
    """Chained segments through the factory's path: generate from the carry, decode warm,
    stitch; seconds include serialising the carry (what a worker stores)."""
    fam = family_of(generator.name)
    new = fam.chunk_frames * args.chunks
    overlap = fam.segment_overlap
    plans = plan_segments(new * args.segments, new + overlap, overlap, (0,), overlap)
    prompt = generator.embedding("gpu check", "", embeddings(generator.pipe))
    carry, tail, written, joins, segments = None, None, [], [], []
    for plan in plans:
        spec = SegmentSpec(plan.index, plan.frames, args.width, args.height, 24,
                           plan.first_frame, plan.context)  # fmt: skip
        started = time.perf_counter()
        frames, carry = generator.generate_continuing(
            spec, prompt, carry, segment_seed(7, plan.index)
        )
        stitched = stitch(plan, frames, tail)
        seconds = time.perf_counter() - started
        tail = stitched.tail
        if plan.index:
            joins.append(sum(len(w) for w in written))
        written.append(stitched.frames)
        memory = generator.last_memory or {}
        segments.append({"segment": plan.index, "seconds": round(seconds, 3),
                         "frames": len(stitched.frames), "memory": memory})  # fmt: skip
        print(f"  {generator.name} {generator.attention[0] if generator.attention else ''} "
              f"segment {plan.index}: {seconds:7.2f} s, {memory.get('phases')}",
              flush=True)  # fmt: skip
    video = np.concatenate(written)
    jumps = np.abs(np.diff(video.astype(np.float32), axis=0)).mean(axis=(1, 2, 3))
    inside = float(np.median(np.delete(jumps, [j - 1 for j in joins])))
    seconds = sum(s["seconds"] for s in segments)
    return {
        "frames": len(video),
        "seconds": round(seconds, 3),
        "frames_per_second": round(len(video) / seconds, 2),
        "joins": [round(float(jumps[j - 1]) / inside, 3) for j in joins],
        "inside_median": round(inside, 3),
        "segments": segments,
    }


def warm_up(generator: LatentGenerator, args: argparse.Namespace) -> None:
    """One chunk first: kernels compiled and caches filled outside the timed runs."""
    fam = family_of(generator.name)
    prompt = generator.embedding("warm up", "", embeddings(generator.pipe))
    spec = SegmentSpec(0, fam.chunk_frames, args.width, args.height, 24, 0, 0)
    generator.generate_continuing(spec, prompt, None, 1)


def run_bare(generator: LatentGenerator, args: argparse.Namespace, frames: int) -> dict[str, Any]:
    """One pipeline call of the same length, decoding inside (what a user of diffusers runs)."""
    import torch

    pipe = generator.pipe
    embeds = {k: v.to(args.device, generator.dtype) for k, v in
              embeddings(pipe).items()}  # fmt: skip
    chunk = generator.family.chunk_latents
    latents = frames // generator.time_stride
    if generator.name == "helios":
        call = dict(num_frames=latents // chunk * 33,
                    pyramid_num_inference_steps_list=[args.steps] * 3,
                    guidance_scale=1.0, is_amplify_first_chunk=True)  # fmt: skip
    else:
        parts = [1] + [3] * (latents // 3 - 1) + [2]
        call = dict(num_frames=4 * (latents - 1) + 1, chunk_partition=parts,
                    num_inference_steps=args.steps, guidance_scale=1.0,
                    negative_prompt_embeds=None)  # fmt: skip
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    started = time.perf_counter()
    with torch.no_grad():
        out = pipe(**{**embeds, **call}, height=args.height, width=args.width,
                   generator=torch.Generator("cpu").manual_seed(0),
                   output_type="np").frames  # fmt: skip
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    made = int(np.asarray(out[0]).shape[0])
    return {"frames": made, "seconds": round(seconds, 3),
            "frames_per_second": round(made / seconds, 2)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    from factory.generate.gpu_check import available_backends, check_parser, fill_device_and_size

    parser = check_parser(__doc__, "gpu_check_latent.json", "640x384")
    parser.add_argument("--families", default="helios,anyflow-far")
    parser.add_argument("--chunks", type=int, default=4, help="chunks per segment")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--backends", default=None, help="Helios: comma-separated")
    args = parser.parse_args(argv)
    resolution = fill_device_and_size(args, tiny="128x64", full="640x384")
    if args.tiny:
        args.chunks = min(args.chunks, 1)

    backends = args.backends.split(",") if args.backends else available_backends(args.device)
    report: dict[str, Any] = {"device": args.device, "tiny": args.tiny, "resolution": resolution,
                              "families": {}}  # fmt: skip
    started = time.perf_counter()
    for family in args.families.split(","):
        steps = args.steps or (2 if family == "helios" else 4)
        args.steps = steps
        built = time.perf_counter()
        pipe = build(family, tiny=args.tiny, device=args.device)
        print(f"{family}: built in {time.perf_counter() - built:.1f} s", flush=True)
        rows = []
        for backend in backends if family == "helios" else ["flex"]:
            generator = generator_for(family, pipe, args.device, steps, backend)
            warm_up(generator, args)
            _reset_peak(args.device)
            factory = run_factory(generator, args)
            bare = run_bare(generator, args, factory["frames"])
            row = {"backend": backend, "factory": factory, "bare": bare,
                   "factory_over_bare": round(factory["frames_per_second"]
                                              / bare["frames_per_second"], 3),
                   "peak": _peaks(args.device)}  # fmt: skip
            rows.append(row)
            print(f"  {family} {backend}: factory {factory['frames_per_second']} frames/s, "
                  f"bare {bare['frames_per_second']} frames/s, ratio "
                  f"{row['factory_over_bare']}, joins/inside {factory['joins']}",
                  flush=True)  # fmt: skip
        report["families"][family] = rows
        args.steps = None
        del pipe
        gc.collect()
        if args.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()
    report["wall_seconds"] = round(time.perf_counter() - started, 1)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"\nwrote {args.out} ({report['wall_seconds']} s in all)")
    return 0


def _reset_peak(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.reset_peak_memory_stats()


def _peaks(device: str) -> dict[str, int] | None:
    if not device.startswith("cuda"):
        return None
    import torch

    return {"allocated": torch.cuda.max_memory_allocated(),
            "reserved": torch.cuda.max_memory_reserved()}  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
