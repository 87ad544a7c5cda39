"""Tiny random-initialised diffusers components, built from config and saved to a folder the
way a real model directory looks (`save_pretrained`), for offline CPU tests. No weights are
ever downloaded: the tokenizer is a SentencePiece model trained here on a few sentences."""

from __future__ import annotations

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


def save_skyreels_df(folder: Path) -> Path:
    import torch
    from diffusers import (
        AutoencoderKLWan,
        SkyReelsV2DiffusionForcingPipeline,
        SkyReelsV2Transformer3DModel,
        UniPCMultistepScheduler,
    )
    from transformers import UMT5Config, UMT5EncoderModel

    tok = tokenizer()
    torch.manual_seed(0)
    text_encoder = UMT5EncoderModel(
        UMT5Config(
            vocab_size=len(tok),
            d_model=32,
            d_kv=8,
            d_ff=37,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            feed_forward_proj="gated-gelu",
        )
    ).eval()
    vae = AutoencoderKLWan(
        base_dim=3,
        z_dim=16,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
    ).eval()
    transformer = SkyReelsV2Transformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=16,
        out_channels=16,
        text_dim=32,
        freq_dim=256,
        ffn_dim=32,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    ).eval()
    scheduler = UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=8.0
    )
    SkyReelsV2DiffusionForcingPipeline(
        tokenizer=tok,
        text_encoder=text_encoder,
        vae=vae,
        transformer=transformer,
        scheduler=scheduler,
    ).save_pretrained(folder)
    return folder
