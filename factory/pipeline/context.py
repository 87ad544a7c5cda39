"""What every stage function needs, built once per process."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from factory.db.state import Job, JobStateMachine
from factory.generate import Generator, PromptEmbedding, make_generator
from factory.spec import ModelChoice, VideoSpec
from factory.store.base import Store

CHUNK_SECONDS = 10.0  # encode this much video per chunk, as soon as its segments exist


@dataclass
class StageContext:
    machine: JobStateMachine
    store: Store
    work_root: Path  # local scratch space (concat lists, temporary files)
    stitch_strength: float = 1.0
    drift_factor: float = 0.0  # pull each segment's colours toward the first segment's (0..1)
    device: str = "cpu"
    attention_override: str | None = None  # FACTORY_ATTENTION_BACKEND
    on_segment: Callable[[Job, int], None] | None = None  # e.g. start encoding a ready chunk
    _generators: dict[ModelChoice, Generator] = field(default_factory=dict)
    _prompts: dict[tuple[ModelChoice, str, str], PromptEmbedding] = field(default_factory=dict)

    def generator(self, model: ModelChoice) -> Generator:
        """One generator per model, loaded once and kept warm for the next segments."""
        if model not in self._generators:
            generator = make_generator(model, self.attention_override)
            generator.load(self.device)
            self._generators[model] = generator
        return self._generators[model]

    def prompt(self, model: ModelChoice, text: str, negative: str) -> PromptEmbedding:
        """Prompt embeddings, encoded once per process for each (model, prompt, negative)."""
        key = (model, text, negative)
        if key not in self._prompts:
            self._prompts[key] = self.generator(model).encode_prompt(text, negative)
        return self._prompts[key]

    def work_dir(self, video: VideoSpec) -> Path:
        path = self.work_root / video.batch / video.video_id
        path.mkdir(parents=True, exist_ok=True)
        return path
