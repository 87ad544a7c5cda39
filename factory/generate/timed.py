"""The timed generator: procedural frames that cost a fixed time per segment, like a GPU.

For benchmarks and recovery tests: a 2-minute job with 10 s segments behaves, as far as the
scheduler, the sweeper and the encoder overlap are concerned, like one on a real model.
"""

from __future__ import annotations

import time
from typing import Any

from factory.generate.base import Frames, PromptEmbedding, SegmentSpec
from factory.generate.procedural import ProceduralGenerator
from factory.infra import stopping


class TimedGenerator:
    name = "timed"
    carries_latents = False
    last_memory: dict[str, Any] | None = None

    def __init__(self, seconds_per_segment: float) -> None:
        self.seconds_per_segment = seconds_per_segment
        self._frames = ProceduralGenerator()

    def load(self, device: str) -> None:
        self._frames.load(device)

    def encode_prompt(self, prompt: str, negative_prompt: str = "") -> PromptEmbedding:
        return self._frames.encode_prompt(prompt, negative_prompt)

    def generate(
        self, seg: SegmentSpec, prompt: PromptEmbedding, context: Frames | None, seed: int
    ) -> Frames:
        deadline = time.monotonic() + self.seconds_per_segment
        frames = self._frames.generate(seg, prompt, context, seed)
        remaining = deadline - time.monotonic()
        if remaining > 0:
            stopping.sleep(remaining)  # like a GPU between steps: a lost job stops at once
        return frames
