"""`factory gpu plan`: GPU memory per component, estimated from a model's config before any
weights are loaded.

Weights are exact: the modules are built on torch's `meta` device from their config.json
(no memory, no download) and their parameters counted. Activations, VAE decode and context
are estimates from the shapes (formulas in docs/models.md); `factory gpu report` shows
what segments really used, and both sit side by side in docs/benchmarks.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from factory.errors import BadInput
from factory.generate.families import FAMILIES
from factory.spec import CAMERA_FAMILIES, IMAGE_FAMILIES

GIB = 1 << 30

# The released models' configs, for planning without a model directory (Wan2.1 / SkyReels-V2
# 1.3B, Wan2.1-VACE 1.3B, LTX-Video 2B 0.9.x; text encoders umt5-xxl and t5-v1_1-xxl).
WAN_13B = dict(
    patch_size=[1, 2, 2],
    num_attention_heads=12,
    attention_head_dim=128,
    in_channels=16,
    out_channels=16,
    text_dim=4096,
    freq_dim=256,
    ffn_dim=8960,
    num_layers=30,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    rope_max_seq_len=1024,
)
_XXL = dict(
    d_model=4096, d_ff=10240, d_kv=64, num_heads=64, num_layers=24, feed_forward_proj="gated-gelu"
)
_UMT5 = ("UMT5EncoderModel", dict(vocab_size=256384, **_XXL))
_WAN_VAE = ("AutoencoderKLWan", {})
REFERENCE: dict[str, dict[str, Any]] = {
    "skyreels-v2-df": {
        "transformer": ("SkyReelsV2Transformer3DModel", WAN_13B),
        "vae": _WAN_VAE,
        "text_encoder": _UMT5,
    },
    "wan": {
        "transformer": (
            "WanVACETransformer3DModel",
            dict(WAN_13B, vace_layers=list(range(0, 30, 2)), vace_in_channels=96),
        ),
        "vae": _WAN_VAE,
        "text_encoder": _UMT5,
    },
    "ltx-video": {
        "transformer": ("LTXVideoTransformer3DModel", {}),
        "vae": ("AutoencoderKLLTXVideo", {}),
        "text_encoder": ("T5EncoderModel", dict(vocab_size=32128, **_XXL)),
    },
    # Helios is 14B (from Wan2.1-T2V-14B: the class's defaults); AnyFlow-FAR 1.3B and 14B.
    "helios": {
        "transformer": ("HeliosTransformer3DModel", {}),
        "vae": _WAN_VAE,
        "text_encoder": _UMT5,
    },
    "anyflow-far": {
        "transformer": (
            "AnyFlowFARTransformer3DModel",
            {k: v for k, v in WAN_13B.items() if k not in ("qk_norm", "rope_max_seq_len")},
        ),
        "vae": _WAN_VAE,
        "text_encoder": _UMT5,
    },
}
# Other sizes of a family's released transformer (`factory gpu plan --size`).
SIZES: dict[str, dict[str, tuple[str, dict[str, Any]]]] = {
    "helios": {"14B": REFERENCE["helios"]["transformer"]},
    "anyflow-far": {
        "1.3B": REFERENCE["anyflow-far"]["transformer"],
        "14B": ("AnyFlowFARTransformer3DModel", {}),
    },
}
# diffusers runs Wan-style guidance as two passes and LTX's as one batch of two.
_GUIDANCE_BATCH = {"skyreels-v2-df": 1, "wan": 1, "ltx-video": 2, "helios": 1, "anyflow-far": 1}
HELIOS_CALL_LATENTS = 9 + 2 + 0.25 + 0.25  # a chunk, short history + anchor, mid, long
FAR_FULL_LATENTS = 12  # the newest chunks at full resolution; older ones at a 4x4 patch


@dataclass
class Line:
    component: str
    bytes: int
    on_gpu: bool
    how: str  # "exact (parameters)" or "estimate"


@dataclass
class MemoryPlan:
    family: str
    width: int
    height: int
    frames: int
    tokens: int
    lines: list[Line]

    @property
    def gpu_total(self) -> int:
        return sum(line.bytes for line in self.lines if line.on_gpu)

    def to_dict(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "resolution": f"{self.width}x{self.height}",
            "segment_frames": self.frames,
            "tokens": self.tokens,
            "components": [line.__dict__ for line in self.lines],
            "gpu_total": self.gpu_total,
        }


def _configs(
    family: str, model_dir: str | None, size: str | None = None
) -> dict[str, tuple[str, dict[str, Any]]]:
    if model_dir is None:
        if size is None:
            return REFERENCE[family]
        sizes = SIZES.get(family, {})
        if size not in sizes:
            known = ", ".join(sizes) or "only the released size"
            raise BadInput(f"{family} has no {size!r} (known: {known})", field="--size")
        return {**REFERENCE[family], "transformer": sizes[size]}
    root = Path(model_dir)
    index_file = root / "model_index.json"
    if not index_file.is_file():
        raise BadInput(f"{root} has no model_index.json", field="--model")
    index = json.loads(index_file.read_text())
    found = {}
    for name in ("transformer", "vae", "text_encoder"):
        spec = index.get(name)
        config_file = root / name / "config.json"
        if not spec or spec[1] is None or not config_file.is_file():
            continue
        config = json.loads(config_file.read_text())
        found[name] = (spec[1], {k: v for k, v in config.items() if not k.startswith("_")})
    if "transformer" not in found:
        raise BadInput(f"{root} has no transformer/config.json", field="--model")
    return found


def _meta_module(class_name: str, config: dict[str, Any]) -> Any:
    import diffusers
    import torch
    import transformers

    with torch.device("meta"):
        if hasattr(diffusers, class_name):
            return getattr(diffusers, class_name).from_config(config)
        model_class = getattr(transformers, class_name)
        config_class = model_class.config_class
        return model_class(
            config_class(**{k: v for k, v in config.items() if k not in ("architectures",)})
        )


def _parameter_count(module: Any) -> int:
    return sum(p.numel() for p in module.parameters())


def _segment_frames(family: str, width: int, height: int, frames: int) -> int:
    """Check the family and the resolution, and give the frames the pipeline really makes."""
    if family not in FAMILIES:
        raise BadInput(f"{family!r} is not one of {', '.join(FAMILIES)}", field="--family")
    fam = FAMILIES[family]
    if width % fam.size_multiple or height % fam.size_multiple:
        raise BadInput(
            f"{width}x{height} does not suit {family}: width and height must be multiples "
            f"of {fam.size_multiple}",
            field="--resolution",
        )
    if frames % fam.time_stride != 1 and not fam.carries_latents:  # what the pipeline makes
        frames = (frames // fam.time_stride + 1) * fam.time_stride + 1
    return frames


def _tokens(family: str, tcfg: dict[str, Any], width: int, height: int, frames: int,
            extra_latents: int = 0) -> int:  # fmt: skip
    """The transformer's tokens in one call: latent frames (and `extra_latents`, VACE's
    reference pictures) times patches per latent frame."""
    fam = FAMILIES[family]
    latent_frames = (frames - 1) // fam.time_stride + 1 + extra_latents
    spatial = 32 if family == "ltx-video" else 8
    patch = tcfg.get("patch_size", 1)
    patch_h, patch_w = (patch[1], patch[2]) if isinstance(patch, list | tuple) else (patch, patch)
    per_latent = (height // spatial // patch_h) * (width // spatial // patch_w)
    if family == "helios":  # one chunk at a time with its compressed history
        latent_frames = HELIOS_CALL_LATENTS
    elif family == "anyflow-far":  # the checkpoint's window; older chunks compressed
        window = sum(tcfg.get("chunk_partition") or (1, 3, 3, 3, 3, 3, 3, 2))
        latent_frames = min(window, FAR_FULL_LATENTS) + max(window - FAR_FULL_LATENTS, 0) / 4
    return int(latent_frames * per_latent)


def _weight_lines(
    modules: dict[str, Any],
    layers: int,
    *,
    layerwise_fp8: bool,
    group_offload: bool,
    text_encoder_on_gpu: bool,
) -> list[Line]:
    """The weights, exact from the parameter counts: transformer, VAE, text encoder."""
    bf16 = 2
    lines = []
    params = _parameter_count(modules["transformer"])
    weight_bytes = params * (1 if layerwise_fp8 else bf16)
    if group_offload:  # one block resident plus what sits outside the blocks
        weight_bytes = weight_bytes // max(layers, 1) * 2
    lines.append(Line("transformer weights", weight_bytes, True, "exact (parameters)"))
    if "vae" in modules:
        lines.append(
            Line("VAE weights", _parameter_count(modules["vae"]) * bf16, True, "exact (parameters)")
        )
    if "text_encoder" in modules:
        lines.append(
            Line(
                "text encoder weights",
                _parameter_count(modules["text_encoder"]) * bf16,
                text_encoder_on_gpu,
                "exact (parameters)",
            )
        )
    return lines


def _denoise_lines(family: str, tcfg: dict[str, Any], tokens: int) -> list[Line]:
    """The estimates while denoising: one block's activations, the latents and scheduler."""
    bf16 = 2
    inner = tcfg.get("num_attention_heads", 32) * tcfg.get("attention_head_dim", 64)
    ffn = tcfg.get("ffn_dim") or 4 * inner
    batch = _GUIDANCE_BATCH[family]
    # One block's live tensors: the residual stream (2 copies), q/k/v/out, the FFN's inner
    # layer, with memory-efficient attention (no tokens^2 matrix); cross-attention K/V.
    per_token = 2 * inner + 4 * inner + ffn
    text_len = FAMILIES[family].max_sequence_length
    activations = batch * (tokens * per_token + 2 * text_len * inner) * bf16
    return [
        Line("activations (one block)", activations, True, "estimate"),
        Line("latents + scheduler state", batch * tokens * inner // 4 * 4, True, "estimate"),
    ]


def _decode_lines(
    family: str, modules: dict[str, Any], width: int, height: int, frames: int, vae_tiling: bool
) -> list[Line]:
    """The estimates after denoising: the VAE decode, and the carry or the tail encode."""
    bf16 = 2
    fam = FAMILIES[family]
    lines = []
    vcfg = dict(modules["vae"].config) if "vae" in modules else {}
    pixels = width * height
    if vae_tiling:
        pixels = min(pixels, 512 * 512)
    if family == "ltx-video":  # decodes the whole clip at once; tiling decodes in chunks
        channels = (vcfg.get("decoder_block_out_channels") or (128,))[0]
        decoded, live, context_frames = (min(frames, 16) if vae_tiling else frames), 2, 9
    else:  # Wan's causal VAE: 4 output frames at a time, with caches (more live tensors)
        channels = vcfg.get("base_dim", 96)
        decoded, live, context_frames = 4, 6, 4
    output = frames * width * height * 3 * 4  # the decoded clip in float32
    if fam.carries_latents:  # the decode window also re-decodes the context latent frames
        output += fam.decode_context * fam.time_stride * width * height * 3 * 4
    decode = decoded * pixels * channels * bf16 * live + output
    lines.append(Line("VAE decode", decode, True, "estimate"))
    if fam.carries_latents:  # no tail to encode: the carry is a few latent frames
        carry = 16 * (fam.decode_context + 19) * (height // 8) * (width // 8) * 4
        lines.append(Line("carry (latents)", carry, True, "estimate"))
    else:
        context = context_frames * pixels * channels * bf16 * live
        lines.append(Line("context (tail encode)", context, True, "estimate"))
    return lines


def plan(
    family: str,
    width: int,
    height: int,
    frames: int,
    model_dir: str | None = None,
    *,
    layerwise_fp8: bool = False,
    group_offload: bool = False,
    text_encoder_on_gpu: bool = False,
    vae_tiling: bool = False,
    size: str | None = None,
    first_frame: bool = False,
    reference_images: int = 0,
    control: bool = False,
) -> MemoryPlan:
    """`first_frame`, `reference_images`, `control`: what a scene brings (docs/manifest.md,
    "Images", "Camera moves"): a picture to start from, VACE reference pictures (a latent
    frame each, ahead of the segment's), a camera move (VACE's control frames, or LTX-Video's
    video condition, VAE-encoded)."""
    _check_material(family, first_frame, reference_images, control)
    frames = _segment_frames(family, width, height, frames)
    configs = _configs(family, model_dir, size)
    modules = {name: _meta_module(*spec) for name, spec in configs.items()}
    tcfg = dict(modules["transformer"].config)
    tokens = _tokens(family, tcfg, width, height, frames, extra_latents=reference_images)
    lines = _weight_lines(
        modules,
        tcfg.get("num_layers", 1),
        layerwise_fp8=layerwise_fp8,
        group_offload=group_offload,
        text_encoder_on_gpu=text_encoder_on_gpu,
    )
    lines += _denoise_lines(family, tcfg, tokens)
    lines += _decode_lines(family, modules, width, height, frames, vae_tiling)
    lines += _material_lines(family, modules, width, height, frames, vae_tiling,
                             first_frame, reference_images, control)  # fmt: skip
    return MemoryPlan(family, width, height, frames, tokens, lines)


def _check_material(family: str, first_frame: bool, references: int, control: bool) -> None:
    if first_frame and family not in IMAGE_FAMILIES["first-frame"]:
        raise BadInput(f"{family} cannot start from a picture", field="--first-frame")
    if references and family not in IMAGE_FAMILIES["reference"]:
        raise BadInput(f"{family} takes no reference pictures", field="--reference-images")
    if control and family not in CAMERA_FAMILIES:
        raise BadInput(f"{family} cannot follow a camera move", field="--control")


def _material_lines(
    family: str, modules: dict[str, Any], width: int, height: int, frames: int,
    vae_tiling: bool, first_frame: bool, references: int, control: bool,
) -> list[Line]:  # fmt: skip
    """The VAE encodes of what a scene brings (estimates, as the tail encode's): a first
    frame and each reference picture is one frame (Helios also encodes the first frame held
    for a chunk, 33 frames, 4 at a time); a camera move is the segment's frames,
    4 at a time (Wan's causal VAE) or the whole clip at once (LTX-Video's VAE, in chunks of
    16 frames with tiling, as its decode), with the template's frames held in float32."""
    bf16, live = 2, 6
    vcfg = dict(modules["vae"].config) if "vae" in modules else {}
    channels = vcfg.get("base_dim", 96)
    pixels = min(width * height, 512 * 512) if vae_tiling else width * height
    one_frame = pixels * channels * bf16 * live
    lines = []
    if first_frame and family == "helios":  # also encoded held for a chunk (33 frames)
        held = 33 * width * height * 3 * 4
        lines.append(Line("first frame (VAE encode, held for a chunk)", 4 * one_frame + held,
                          True, "estimate"))  # fmt: skip
    elif first_frame:
        lines.append(Line("first frame (VAE encode)", one_frame, True, "estimate"))
    if references:
        lines.append(Line(f"reference pictures x{references} (VAE encode)",
                          references * one_frame, True, "estimate"))  # fmt: skip
    if control and family == "ltx-video":
        held = frames * width * height * 3 * 4
        ltx_channels = (vcfg.get("block_out_channels") or (128,))[0]
        encoded = (min(frames, 16) if vae_tiling else frames) * pixels * ltx_channels * bf16 * 2
        lines.append(Line("camera move (video condition, VAE encode)", encoded + held, True,
                          "estimate"))  # fmt: skip
    elif control:
        held = frames * width * height * 3 * 4
        lines.append(Line("camera move (control frames, VAE encode)", 4 * one_frame + held,
                          True, "estimate"))  # fmt: skip
    return lines
