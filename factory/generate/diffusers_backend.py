"""Real open video models through diffusers, loaded from a local model directory.

Family `skyreels-v2-df` (SkyReels-V2 diffusion forcing): segment 0 is text-to-video; every
later segment extends the previous segment's tail with the VideoToVideo diffusion-forcing
pipeline (`addnoise_condition` keeps the conditioning frames from being copied verbatim).
Both pipelines share one set of modules. Prompts arrive as embeddings, so generation never
needs the text encoder once they are encoded. Weights are never downloaded: the hub is
switched off and a directory without the files `model_index.json` names is refused with
the list of what is missing.

Wan's frame counts come in 4k+1 (the VAE compresses time by 4): a segment of L frames is
generated as the next 4k+1 >= L and trimmed; the overlap must itself be 4k+1 frames.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from factory.errors import PermanentError
from factory.generate.attention import Capabilities, choose
from factory.generate.base import Frames, PromptEmbedding, SegmentSpec
from factory.generate.guard import check_float_output
from factory.spec import ModelChoice

log = logging.getLogger(__name__)

TIME_STRIDE = 4
DEFAULT_STEPS = 30
DEFAULT_GUIDANCE = 6.0
ADDNOISE_CONDITION = 20
MAX_SEQUENCE_LENGTH = 512


def check_model_dir(path: str) -> list[str]:
    """The component folders `model_index.json` names; raises naming whatever is missing."""
    root = Path(path)
    index = root / "model_index.json"
    if not index.is_file():
        raise PermanentError(
            f"model directory {root}: missing model_index.json (is this a "
            "diffusers pipeline folder saved with save_pretrained?)"
        )
    components = [
        name
        for name, spec in json.loads(index.read_text()).items()
        if not name.startswith("_") and isinstance(spec, list) and spec[0] is not None
    ]
    missing = [name for name in components if not (root / name).is_dir()]
    if missing:
        raise PermanentError(f"model directory {root}: missing {', '.join(sorted(missing))}")
    return components


def frames_for_model(frames: int) -> int:
    return frames if frames % TIME_STRIDE == 1 else (frames // TIME_STRIDE + 1) * TIME_STRIDE + 1


@dataclass
class _Pipelines:
    text_to_video: Any
    video_to_video: Any
    device: str


class SkyReelsDiffusionForcing:
    name = "skyreels-v2-df"

    def __init__(self, model: ModelChoice, attention_override: str | None = None) -> None:
        assert model.path is not None
        self.model = model
        self.attention_override = attention_override
        self.attention: tuple[str, str] | None = None  # (backend, reason), once loaded
        self.steps = model.steps or DEFAULT_STEPS
        self.guidance = model.guidance if model.guidance is not None else DEFAULT_GUIDANCE
        self._pipes: _Pipelines | None = None

    def load(self, device: str) -> None:
        os.environ["HF_HUB_OFFLINE"] = "1"  # never a download, whatever the caller's environment
        os.environ["TRANSFORMERS_OFFLINE"] = "1"
        check_model_dir(self.model.path or "")
        import torch
        from diffusers import (
            SkyReelsV2DiffusionForcingPipeline,
            SkyReelsV2DiffusionForcingVideoToVideoPipeline,
        )
        from diffusers.utils import logging as diffusers_logging
        from transformers.utils import logging as transformers_logging

        diffusers_logging.disable_progress_bar()
        transformers_logging.disable_progress_bar()

        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        base = SkyReelsV2DiffusionForcingPipeline.from_pretrained(
            self.model.path, dtype=dtype, local_files_only=True
        ).to(device)
        extend = SkyReelsV2DiffusionForcingVideoToVideoPipeline(**base.components)
        for pipe in (base, extend):
            pipe.set_progress_bar_config(disable=True)
        # Synchronous diffusion forcing (causal_block_size 1) needs no dense mask.
        self.attention = choose(Capabilities.probe(device), dense_mask=False,
                                override=self.attention_override)  # fmt: skip
        base.transformer.set_attention_backend(self.attention[0])
        log.info("attention.chosen", extra={"backend": self.attention[0],
                                            "reason": self.attention[1]})  # fmt: skip
        self._pipes = _Pipelines(base, extend, device)

    def encode_prompt(self, prompt: str, negative_prompt: str = "") -> PromptEmbedding:
        pipes = self._loaded()
        positive, negative = pipes.text_to_video.encode_prompt(
            prompt=prompt, negative_prompt=negative_prompt or "",
            do_classifier_free_guidance=self.guidance > 1.0, num_videos_per_prompt=1,
            max_sequence_length=MAX_SEQUENCE_LENGTH, device=pipes.device,
        )  # fmt: skip
        return PromptEmbedding(self.name, prompt, negative_prompt, (positive, negative))

    def generate(
        self, seg: SegmentSpec, prompt: PromptEmbedding, context: Frames | None, seed: int
    ) -> Frames:
        import torch
        from PIL import Image

        pipes = self._loaded()
        count = frames_for_model(seg.frames)
        positive, negative = prompt.data
        common = dict(prompt=None, prompt_embeds=positive, negative_prompt_embeds=negative,
                      height=seg.height, width=seg.width, num_frames=count, base_num_frames=count,
                      num_inference_steps=self.steps, guidance_scale=self.guidance,
                      addnoise_condition=ADDNOISE_CONDITION, output_type="np",
                      generator=torch.Generator("cpu").manual_seed(seed))  # fmt: skip
        if context is not None and seg.context and seg.context % TIME_STRIDE != 1:
            raise PermanentError(f"{self.name}: the overlap must be 4k+1 frames, got {seg.context}")
        # Some steps (the conditioning noise) draw from torch's global generator: seed it too,
        # inside a forked RNG state, so a resumed job makes exactly the same frames.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            if context is None or seg.context == 0:
                video = pipes.text_to_video(**common).frames[0]
            else:
                overlap = seg.context
                tail = [Image.fromarray(frame) for frame in context[-overlap:]]
                out = pipes.video_to_video(video=tail, overlap_history=overlap, **common)
                video = out.frames[0][overlap:]  # it returns the input tail, then its frames
        video = np.asarray(video, np.float32)
        check_float_output(video, f"{self.name} segment {seg.index}")
        return np.clip(np.rint(video * 255), 0, 255).astype(np.uint8)[: seg.frames]

    def _loaded(self) -> _Pipelines:
        if self._pipes is None:
            raise PermanentError(f"{self.name}: generate called before load")
        return self._pipes
