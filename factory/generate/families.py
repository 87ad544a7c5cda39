"""What the factory knows about each diffusers model family, without importing torch: the
pipeline classes, the components a GPU worker loads, the names of the prompt embeddings and
the frame and size rules of the family's VAE (checked when a manifest is validated)."""

from __future__ import annotations

from dataclasses import dataclass

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

    @property
    def needed_components(self) -> tuple[str, ...]:
        """The folders a model directory of this family must have."""
        return self.generation_components + self.text_components

    def fitting_overlap(self, frames: int) -> int:
        """The family's default overlap, or the largest stride*k+1 that fits a shorter segment
        (an overlap may be at most half the segment)."""
        if 2 * self.segment_overlap <= frames:
            return self.segment_overlap
        k = (frames // 2 - 1) // self.time_stride
        return k * self.time_stride + 1 if k >= 0 and frames >= 2 else 0

    def overlap_problem(self, overlap: int) -> str | None:
        if overlap and overlap % self.time_stride != 1:
            return (
                f"{overlap} does not suit {self.name}: the overlap must be "
                f"{self.time_stride}k+1 frames (e.g. {self.time_stride + 1} or "
                f"{2 * self.time_stride + 1})"
            )
        return None


_WAN_PARTS = ("transformer", "vae", "scheduler")
FAMILIES: dict[str, Family] = {
    "skyreels-v2-df": Family(
        "skyreels-v2-df",
        "SkyReelsV2DiffusionForcingPipeline",
        _WAN_PARTS,
        ("prompt_embeds", "negative_prompt_embeds"),
        max_sequence_length=512,
        time_stride=4,
        size_multiple=16,
        default_steps=30,
        default_guidance=6.0,
        segment_frames=97,
        segment_overlap=17,
    ),
    "wan": Family(
        "wan",
        "WanVACEPipeline",
        _WAN_PARTS,
        ("prompt_embeds", "negative_prompt_embeds"),
        max_sequence_length=512,
        time_stride=4,
        size_multiple=16,
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
    ),
}


def family_of(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise PermanentError(f"model family {name!r} has no diffusers backend") from None
