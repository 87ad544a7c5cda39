"""Generator backends behind one interface; GPU code lives only in this package."""

from __future__ import annotations

from factory.errors import PermanentError
from factory.generate.base import Frames, Generator, PromptEmbedding, SegmentSpec, segment_seed
from factory.generate.memory import MemoryPolicy
from factory.generate.procedural import ProceduralGenerator
from factory.generate.timed import TimedGenerator
from factory.spec import DIFFUSERS_FAMILIES, LATENT_FAMILIES, ModelChoice

__all__ = [
    "Frames",
    "Generator",
    "MemoryPolicy",
    "PromptEmbedding",
    "SegmentSpec",
    "make_generator",
    "segment_seed",
]


def make_generator(
    model: ModelChoice,
    attention_override: str | None = None,
    memory_policy: MemoryPolicy | None = None,
) -> Generator:
    if model.family == "procedural":
        return ProceduralGenerator()
    if model.family == "timed":
        assert model.seconds_per_segment is not None
        return TimedGenerator(model.seconds_per_segment)
    if model.family in LATENT_FAMILIES:
        from factory.generate.latent_backend import LATENT_GENERATORS

        return LATENT_GENERATORS[model.family](model, attention_override, memory_policy)
    if model.family in DIFFUSERS_FAMILIES:
        from factory.generate.diffusers_backend import GENERATORS

        return GENERATORS[model.family](model, attention_override, memory_policy)
    raise PermanentError(f"unknown model family {model.family!r}")
