"""What the factory knows about each diffusers model family, without importing torch: the
pipeline classes, the components a GPU worker loads, the names of the prompt embeddings and
the frame and size rules of the family's VAE (checked when a manifest is validated)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from factory.errors import PermanentError


@dataclass(frozen=True)
class Family:
    name: str
    text_pipeline: str  # diffusers class loaded (text parts only) to encode prompts
    generation_components: tuple[str, ...]  # what a GPU worker loads
    embedding_names: tuple[str, ...]  # the tensors encode_prompt returns, in order
    max_sequence_length: int
    time_stride: int  # frames per latent frame of the released models' VAE
    size_multiple: int  # width and height must be multiples of this (VAE x patch size)
    default_steps: int
    default_guidance: float
    segment_frames: int  # the released model's native clip length (frames per call)
    segment_overlap: int  # frames re-created at each seam by default (stride*k+1)
    text_components: tuple[str, ...] = ("text_encoder", "tokenizer")  # prompts (preload)
    # The prompt-embedding recipe: families that run the same text encoder the same way share
    # cached embeddings (the cache key names the recipe and the encoder, not the family).
    text_recipe: str = ""
    # Latent families (factory.generate.latent_backend): each segment continues from the
    # previous one's persisted latents in whole chunks of `chunk_latents` latent frames, and
    # the first `decode_context` latent frames before a segment are decoded again with it.
    chunk_latents: int = 0
    decode_context: int = 0
    pipelines: tuple[str, ...] = ()  # model_index.json classes accepted (variants), if several

    @property
    def carries_latents(self) -> bool:
        return self.chunk_latents > 0

    @property
    def chunk_frames(self) -> int:
        """Frames of continuous video one chunk makes (a latent frame spans time_stride)."""
        return self.chunk_latents * self.time_stride

    @property
    def needed_components(self) -> tuple[str, ...]:
        """The folders a model directory of this family must have."""
        return self.generation_components + self.text_components

    @property
    def max_overlap(self) -> int:
        """Latent families: the frames re-decoded before a segment that are warm enough to
        cross-fade (the decode context but its first latent frame, which a causal VAE decodes
        as one picture, and the next, over which the decoder warms up)."""
        return (self.decode_context - 2) * self.time_stride

    def fitting_overlap(self, frames: int) -> int:
        """The family's default overlap, or the largest stride*k+1 that fits a shorter segment
        (an overlap may be at most half the segment)."""
        if self.carries_latents:
            return min(self.segment_overlap, frames // 2)
        if 2 * self.segment_overlap <= frames:
            return self.segment_overlap
        k = (frames // 2 - 1) // self.time_stride
        return k * self.time_stride + 1 if k >= 0 and frames >= 2 else 0

    def overlap_problem(self, overlap: int) -> str | None:
        if self.carries_latents:
            if overlap > self.max_overlap:
                return (
                    f"{overlap} does not suit {self.name}: the overlap is cross-faded from "
                    f"frames decoded again, at most {self.max_overlap}"
                )
            return None
        if overlap and overlap % self.time_stride != 1:
            return (
                f"{overlap} does not suit {self.name}: the overlap must be "
                f"{self.time_stride}k+1 frames (e.g. {self.time_stride + 1} or "
                f"{2 * self.time_stride + 1})"
            )
        return None

    def segment_problem(self, frames: int, overlap: int) -> str | None:
        """Latent families generate whole chunks: segment.frames = n chunks + the overlap."""
        if not self.carries_latents:
            return None
        new = frames - overlap
        if new <= overlap:
            return (
                f"{frames} does not suit {self.name}: the new frames of a segment "
                f"({new}) must be more than the overlap ({overlap})"
            )
        if new % self.chunk_frames:
            chunk = self.chunk_frames
            examples = ", ".join(str(n * chunk + overlap) for n in (1, 2, 4))
            return (
                f"{frames} does not suit {self.name}: segment.frames must be whole chunks of "
                f"{chunk} frames ({self.chunk_latents} latent frames) plus the overlap "
                f"({overlap}), e.g. {examples}"
            )
        return None


_WAN_PARTS = ("transformer", "vae", "scheduler")
UMT5 = "umt5-512"  # Wan's text encoder run by Wan's encode_prompt (512 tokens, zero-padded)


def _wan_lineage(name: str, pipeline: str, **own: Any) -> Family:
    """A family on Wan's parts and text encoder (UMT5, 512 tokens, latent frames 4 apart):
    what SkyReels-V2, Wan, Helios and AnyFlow-FAR share; `own` is where each differs."""
    shared: dict[str, Any] = dict(max_sequence_length=512, time_stride=4, size_multiple=16,
                                  text_recipe=UMT5)  # fmt: skip
    return Family(name, pipeline, _WAN_PARTS, ("prompt_embeds", "negative_prompt_embeds"),
                  **(shared | own))  # fmt: skip


def _chunked_latents(name: str, pipeline: str, *, chunk_latents: int, **own: Any) -> Family:
    """A Wan-lineage family that carries latents between segments in chunks: a segment is
    four chunks plus an 8-frame overlap, and 5 latent frames before it are decoded again."""
    chunk_frames = chunk_latents * 4  # Wan's VAE: a latent frame spans 4 frames
    return _wan_lineage(name, pipeline, chunk_latents=chunk_latents, decode_context=5,
                        segment_frames=4 * chunk_frames + 8, segment_overlap=8,
                        **own)  # fmt: skip


FAMILIES: dict[str, Family] = {
    "skyreels-v2-df": _wan_lineage(
        "skyreels-v2-df",
        "SkyReelsV2DiffusionForcingPipeline",
        default_steps=30,
        default_guidance=6.0,
        segment_frames=97,
        segment_overlap=17,
    ),
    "wan": _wan_lineage(
        "wan",
        "WanVACEPipeline",
        default_steps=30,
        default_guidance=5.0,
        segment_frames=81,
        segment_overlap=17,
    ),
    "ltx-video": Family(
        "ltx-video",
        "LTXConditionPipeline",
        _WAN_PARTS,
        (
            "prompt_embeds",
            "prompt_attention_mask",
            "negative_prompt_embeds",
            "negative_prompt_attention_mask",
        ),
        max_sequence_length=256,
        time_stride=8,
        size_multiple=32,
        default_steps=40,
        default_guidance=3.0,
        segment_frames=121,
        segment_overlap=25,
        text_recipe="t5-256-mask",
    ),
    # Helios: 33-frame chunks in the pipeline's own decode (each chunk decoded alone, its first
    # latent frame as one picture: the visible seam); the factory decodes continuously, where
    # the 9 latent frames of a chunk span 36 frames. Base, mid and distilled from the directory.
    "helios": _chunked_latents(
        "helios",
        "HeliosPipeline",
        chunk_latents=9,
        default_steps=50,
        default_guidance=5.0,
        pipelines=("HeliosPipeline", "HeliosPyramidPipeline"),
    ),
    # AnyFlow-FAR: frame-autoregressive chunks of 3 latent frames (the released partition
    # 1,3,3,3,3,3,3,2 = 81 frames); any step count, guidance distilled in.
    "anyflow-far": _chunked_latents(
        "anyflow-far",
        "AnyFlowFARPipeline",
        chunk_latents=3,
        size_multiple=32,
        default_steps=4,
        default_guidance=1.0,
    ),
}


def family_of(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise PermanentError(f"model family {name!r} has no diffusers backend") from None
