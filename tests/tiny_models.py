"""Tiny random-initialised diffusers components, built from config and saved to a folder the
way a real model directory looks (`save_pretrained`), for offline CPU tests. No weights are
ever downloaded: the tokenizer is a SentencePiece model trained here on a few sentences."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

WORDS = [
    "a harbor at dawn with fog on the water",
    "boats leave the harbor and gulls fly",
    "blurry low quality flicker",
    "a forest in autumn with red leaves",
    "the camera moves",
]


def tokenizer():
    import sentencepiece as spm
    from transformers import T5TokenizerFast

    folder = Path(tempfile.mkdtemp(prefix="tiny-spm-"))
    (folder / "corpus.txt").write_text("\n".join(WORDS * 30))
    spm.SentencePieceTrainer.train(
        input=str(folder / "corpus.txt"),
        model_prefix=str(folder / "spm"),
        vocab_size=60,
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        hard_vocab_limit=False,
        pad_piece="<pad>",
        eos_piece="</s>",
        unk_piece="<unk>",
        minloglevel=2,
    )
    model = spm.SentencePieceProcessor(model_file=str(folder / "spm.model"))
    # transformers 5 ignores `vocab_file=` here: give the pieces themselves.
    pieces = [(model.id_to_piece(i), model.get_score(i)) for i in range(model.get_piece_size())]
    built = T5TokenizerFast(vocab=pieces, extra_ids=0)
    assert built.unk_token_id not in built(WORDS[0], add_special_tokens=False).input_ids
    return built


def _umt5(tok):
    import torch
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(0)
    config = UMT5Config(vocab_size=len(tok), d_model=32, d_kv=8, d_ff=37, num_layers=2,
                        num_heads=4, relative_attention_num_buckets=8,
                        feed_forward_proj="gated-gelu")  # fmt: skip
    return UMT5EncoderModel(config).eval()


def _wan_vae():
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                            temperal_downsample=[False, True, True]).eval()  # fmt: skip


_WAN_TRANSFORMER = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
                        in_channels=16, out_channels=16, text_dim=32, freq_dim=256, ffn_dim=32,
                        cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                        rope_max_seq_len=32)  # fmt: skip


def _flow_unipc():
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=8.0
    )


def _wan_parts() -> dict:
    """The tokenizer, UMT5 text encoder and Wan VAE of the Wan-based families, made in this
    order from seed 0: the transformer made next continues the same random stream."""
    import torch

    tok = tokenizer()
    text_encoder = _umt5(tok)
    torch.manual_seed(0)
    return dict(tokenizer=tok, text_encoder=text_encoder, vae=_wan_vae())


def save_skyreels_df(folder: Path) -> Path:
    from diffusers import SkyReelsV2DiffusionForcingPipeline, SkyReelsV2Transformer3DModel

    parts = _wan_parts()
    transformer = SkyReelsV2Transformer3DModel(num_layers=2, **_WAN_TRANSFORMER).eval()
    pipe = SkyReelsV2DiffusionForcingPipeline(
        transformer=transformer, scheduler=_flow_unipc(), **parts
    )
    pipe.save_pretrained(folder)
    return folder


def save_wan_vace(folder: Path) -> Path:
    from diffusers import WanVACEPipeline, WanVACETransformer3DModel

    parts = _wan_parts()
    # VACE's control input: 2 x 16 latent channels (kept and generated parts) + 64 mask values.
    transformer = WanVACETransformer3DModel(
        num_layers=3, vace_layers=[0, 2], vace_in_channels=96, **_WAN_TRANSFORMER
    ).eval()
    pipe = WanVACEPipeline(transformer=transformer, scheduler=_flow_unipc(), **parts)
    pipe.save_pretrained(folder)
    return folder


def save_ltx_condition(folder: Path) -> Path:
    import torch
    from diffusers import (
        AutoencoderKLLTXVideo,
        FlowMatchEulerDiscreteScheduler,
        LTXConditionPipeline,
        LTXVideoTransformer3DModel,
    )
    from transformers import T5Config, T5EncoderModel

    tok = tokenizer()
    torch.manual_seed(0)
    text_encoder = T5EncoderModel(
        T5Config(vocab_size=len(tok), d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                 relative_attention_num_buckets=8, feed_forward_proj="gated-gelu")
    ).eval()  # fmt: skip
    torch.manual_seed(0)
    transformer = LTXVideoTransformer3DModel(
        in_channels=8, out_channels=8, patch_size=1, patch_size_t=1, num_attention_heads=4,
        attention_head_dim=8, cross_attention_dim=32, num_layers=1, caption_channels=32,
    )  # fmt: skip
    torch.manual_seed(0)
    # Compresses 4x in space and time (the released VAE: 32x and 8x).
    vae = AutoencoderKLLTXVideo(
        in_channels=3, out_channels=3, latent_channels=8, block_out_channels=(8, 8, 8, 8),
        decoder_block_out_channels=(8, 8, 8, 8), layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1, 1),
        spatio_temporal_scaling=(True, True, False, False),
        decoder_spatio_temporal_scaling=(True, True, False, False),
        decoder_inject_noise=(False,) * 5, upsample_residual=(False,) * 4,
        upsample_factor=(1,) * 4, timestep_conditioning=False, patch_size=1, patch_size_t=1,
        encoder_causal=True, decoder_causal=False,
    )  # fmt: skip
    LTXConditionPipeline(
        tokenizer=tok, text_encoder=text_encoder, vae=vae, transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(),
    ).save_pretrained(folder)  # fmt: skip
    return folder


def save_helios(folder: Path, variant: str = "distilled") -> Path:
    """Helios base (HeliosPipeline), mid (pyramid, CFG-Zero*) or distilled (pyramid, DMD).
    gamma 0.25, not the released 1/3: with 1/3 the pyramid's block-noise covariance is singular
    and its Cholesky factorisation fails on the CPU (CUDA's accepts it)."""
    from diffusers import (
        HeliosDMDScheduler,
        HeliosPipeline,
        HeliosPyramidPipeline,
        HeliosScheduler,
        HeliosTransformer3DModel,
    )

    parts = _wan_parts()
    parts["transformer"] = HeliosTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16,
        out_channels=16, text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2,
        rope_dim=(4, 4, 4),
    ).eval()  # fmt: skip
    if variant == "base":
        HeliosPipeline(scheduler=HeliosScheduler(stages=1, stage_range=[0, 1]), **parts)\
            .save_pretrained(folder)  # fmt: skip
        return folder
    scheduler_class = HeliosDMDScheduler if variant == "distilled" else HeliosScheduler
    HeliosPyramidPipeline(
        scheduler=scheduler_class(stages=3, gamma=0.25, use_dynamic_shifting=True),
        is_cfg_zero_star=variant == "mid", is_distilled=variant == "distilled", **parts,
    ).save_pretrained(folder)  # fmt: skip
    return folder


def save_anyflow_far(folder: Path, window: int = 48) -> Path:
    """AnyFlow-FAR tuned (its `chunk_partition`) for `window` latent frames per call in chunks
    of 3 after a first frame, like the released 1,3,3,3,3,3,3,2 (21)."""
    from diffusers import (
        AnyFlowFARPipeline,
        AnyFlowFARTransformer3DModel,
        FlowMapEulerDiscreteScheduler,
    )

    parts = _wan_parts()
    threes, rest = divmod(window - 1, 3)
    partition = (1,) + (3,) * threes + ((rest,) if rest else ())
    transformer = AnyFlowFARTransformer3DModel(
        patch_size=(1, 2, 2), compressed_patch_size=(1, 4, 4), full_chunk_limit=3,
        num_attention_heads=2, attention_head_dim=12, in_channels=16, out_channels=16,
        text_dim=32, freq_dim=32, ffn_dim=32, num_layers=2, rope_max_seq_len=64,
        chunk_partition=partition,
    ).eval()  # fmt: skip
    AnyFlowFARPipeline(
        transformer=transformer,
        scheduler=FlowMapEulerDiscreteScheduler(num_train_timesteps=1000, shift=5.0),
        **parts,
    ).save_pretrained(folder)
    return folder


SAVERS = {
    "skyreels-v2-df": save_skyreels_df,
    "wan": save_wan_vace,
    "ltx-video": save_ltx_condition,
}

# The families that continue from latents, by variant (tests/integration/test_latent_families.py).
LATENT_SAVERS = {
    "helios-base": lambda folder: save_helios(folder, "base"),
    "helios-mid": lambda folder: save_helios(folder, "mid"),
    "helios-distilled": lambda folder: save_helios(folder, "distilled"),
    "anyflow-far": save_anyflow_far,
    "anyflow-far-window13": lambda folder: save_anyflow_far(folder, window=13),
}


ALL_SAVERS = {**SAVERS, **LATENT_SAVERS}


def cached(name: str, root: Path) -> Path:
    """The tiny model NAME (a key of ALL_SAVERS), built once under ROOT and shared by every
    test and pytest worker of the session (a file lock makes the others wait for the first).
    Tests that change a model change a copy of it."""
    import fcntl

    root.mkdir(parents=True, exist_ok=True)
    folder, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            ALL_SAVERS[name](folder)
            done.touch()
    return folder


PIPELINES = {
    "skyreels-v2-df": "SkyReelsV2DiffusionForcingPipeline",
    "wan": "WanVACEPipeline",
    "ltx-video": "LTXConditionPipeline",
}


def save_lora(model_dir: Path, family: str, target: Path, seed: int = 1) -> Path:
    """A LoRA for the tiny model's transformer (rank 4 on the attention projections, random
    rather than zero-initialised, so that it changes the pictures), saved the way trainers
    publish one: a single `.safetensors` file."""
    import diffusers
    import torch
    from peft import LoraConfig, get_peft_model_state_dict

    pipeline_class = getattr(diffusers, PIPELINES[family])
    pipe = pipeline_class.from_pretrained(model_dir, text_encoder=None, tokenizer=None)
    torch.manual_seed(seed)
    pipe.transformer.add_adapter(
        LoraConfig(r=4, lora_alpha=4, init_lora_weights=False,
                   target_modules=["to_q", "to_k", "to_v", "to_out.0"])
    )  # fmt: skip
    folder = Path(tempfile.mkdtemp(prefix="tiny-lora-"))
    state = get_peft_model_state_dict(pipe.transformer)
    pipeline_class.save_lora_weights(folder, transformer_lora_layers=state)
    target.parent.mkdir(parents=True, exist_ok=True)
    (folder / "pytorch_lora_weights.safetensors").replace(target)
    return target
