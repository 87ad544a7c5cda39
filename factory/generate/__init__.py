"""Generator backends behind one interface; GPU code lives only in this package."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from factory.errors import PermanentError
from factory.spec import DIFFUSERS_FAMILIES, LATENT_FAMILIES, ModelChoice

if TYPE_CHECKING:
    from factory.generate.base import Frames, Generator, PromptEmbedding, SegmentSpec, segment_seed
    from factory.generate.memory import MemoryPolicy

# The package's names load on first use: the manifest reads the family tables
# (factory/generate/families.py) without numpy and the generators behind them (issue 35).
_WHERE = {
    "Frames": "factory.generate.base",
    "Generator": "factory.generate.base",
    "PromptEmbedding": "factory.generate.base",
    "SegmentSpec": "factory.generate.base",
    "segment_seed": "factory.generate.base",
    "MemoryPolicy": "factory.generate.memory",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
        from factory.generate.procedural import ProceduralGenerator

        return ProceduralGenerator()
    if model.family == "timed":
        from factory.generate.timed import TimedGenerator

        assert model.seconds_per_segment is not None
        return TimedGenerator(model.seconds_per_segment)
    if model.family in LATENT_FAMILIES:
        from factory.generate.latent_backend import LATENT_GENERATORS

        return LATENT_GENERATORS[model.family](model, attention_override, memory_policy)
    if model.family in DIFFUSERS_FAMILIES:
        from factory.generate.diffusers_backend import GENERATORS

        return GENERATORS[model.family](model, attention_override, memory_policy)
    raise PermanentError(f"unknown model family {model.family!r}")
