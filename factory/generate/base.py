"""The generator interface: what every backend (procedural, timed, diffusers) provides.

Generators are loaded once per worker process and know nothing of the database or the
store: they turn (segment, prompt, context frames, seed) into frames.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

Frames = np.ndarray  # [T, H, W, 3] uint8, RGB


@dataclass(frozen=True)
class SegmentSpec:
    index: int
    frames: int  # how many frames to generate
    width: int
    height: int
    fps: int
    first_frame: int  # output frame index of generated frame 0 (time = first_frame / fps)
    context: int  # how many leading frames continue the given context frames
    shot_first: int = 0  # the index of its shot's first segment (factory/plan/shots.py)
    # A picture its scene brings (RGB uint8 at width x height) and its role: `first-frame`
    # (given to the shot's first segment: it starts from the picture) or `reference` (given
    # to every segment of the scene). Families that cannot use a role are refused at submit.
    image: Any = field(default=None, compare=False, repr=False)
    image_role: str | None = None
    # A camera move it follows (factory/media/control.py): the template's frames for each of
    # its generated frames (uint8 [frames, H, W, 3]), where the template's content has moved
    # to by each (dx, dy px, [frames, 2]), and how strongly to follow it (0..1).
    control: Any = field(default=None, compare=False, repr=False)
    control_track: Any = field(default=None, compare=False, repr=False)
    control_strength: float = 1.0

    @property
    def starts_shot(self) -> bool:
        """Generated from nothing (the video's or a shot's first segment), not continued."""
        return self.index == self.shot_first


@dataclass(frozen=True)
class PromptEmbedding:
    model: str  # which model (and text encoder) made it
    prompt: str
    negative_prompt: str
    data: Any  # backend-specific: tensors for diffusers, parameters for procedural


class Generator(Protocol):
    name: str
    # Continues a segment from the previous one's carried latents (a latent family), not from
    # its decoded tail frames: the pipeline stores and hands over the carry instead.
    carries_latents: bool
    # What GPU memory the last generate() used (None where nothing is measured: off the GPU).
    last_memory: dict[str, Any] | None

    def load(self, device: str) -> None: ...

    def encode_prompt(self, prompt: str, negative_prompt: str = "") -> PromptEmbedding: ...

    def generate(
        self, seg: SegmentSpec, prompt: PromptEmbedding, context: Frames | None, seed: int
    ) -> Frames: ...


def segment_seed(job_seed: int, segment: int, regeneration: int = 0) -> int:
    """The seed of one segment: fixed by the job's seed, so a resumed job makes the same frames;
    a QC regeneration asks for a different one."""
    text = f"{job_seed}:{segment}" + (f":{regeneration}" if regeneration else "")
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")
