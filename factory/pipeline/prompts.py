"""Prompt embeddings for the diffusers families, through the shared cache: looked up by key,
and on a miss encoded by the text encoder alone (loaded once for all of a job's or a
manifest's missing prompts, then freed), so a GPU worker never loads the text encoder for
a prompt that `factory preload` or an earlier job already encoded."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from factory.config import Settings
from factory.db.session import Database
from factory.generate.embeddings import EmbeddingCache, RedisBlobs, StoreBlobs, cache_key
from factory.generate.families import family_of
from factory.spec import ModelChoice
from factory.store.base import Store

log = logging.getLogger(__name__)


def open_embedding_cache(
    settings: Settings, database: Database, store: Store
) -> EmbeddingCache | None:
    if settings.embedding_cache == "off":
        return None
    if settings.embedding_cache == "redis":
        assert settings.redis_url is not None
        blobs: RedisBlobs | StoreBlobs = RedisBlobs(settings.redis_url)
    else:
        blobs = StoreBlobs(store)
    return EmbeddingCache(database, blobs, settings.embedding_cache_bytes)


def model_label(model: ModelChoice) -> str:
    return f"{model.family}:{model.path}"


@dataclass
class EnsureResult:
    hits: int = 0
    misses: int = 0
    not_stored: int = 0  # encoded but larger than the whole cache
    text_encoder_bytes: int = 0  # what the encoder weighed (0 if it was never loaded)
    encoded: dict[tuple[str, str], bytes] = field(default_factory=dict)  # not stored

    def add(self, other: EnsureResult) -> None:
        self.hits += other.hits
        self.misses += other.misses
        self.not_stored += other.not_stored
        self.text_encoder_bytes = max(self.text_encoder_bytes, other.text_encoder_bytes)


class PromptService:
    def __init__(self, cache: EmbeddingCache, text_device: str = "cpu") -> None:
        self.cache = cache
        self.text_device = text_device

    def key(self, model: ModelChoice, prompt: str, negative: str) -> str:
        from factory.generate.text_encoding import text_encoder_identity

        # The recipe and the encoder, not the family or the directory: Wan, SkyReels-V2, Helios
        # and AnyFlow-FAR run the same umt5-xxl the same way, and one entry serves them all.
        family = family_of(model.family)
        identity = text_encoder_identity(model.path or "")
        recipe = family.text_recipe or model.family
        return cache_key(recipe, identity, prompt, negative, family.max_sequence_length)

    def lookup(self, model: ModelChoice, prompt: str, negative: str) -> bytes | None:
        return self.cache.get(self.key(model, prompt, negative))

    def ensure(
        self,
        model: ModelChoice,
        pairs: Iterable[tuple[str, str]],
        on_each: Callable[[str], None] | None = None,
    ) -> EnsureResult:
        """Every (prompt, negative) in the cache afterwards; misses encoded together."""
        from factory.generate.text_encoding import TextEncoder, embedding_to_bytes

        result = EnsureResult()
        missing = []
        for pair in dict.fromkeys(pairs):
            if not self.cache.contains(self.key(model, *pair)):
                missing.append(pair)
            else:
                result.hits += 1
                if on_each:
                    on_each(pair[0])
        if not missing:
            return result
        encoder = TextEncoder(model)
        encoder.load(self.text_device)
        try:
            result.text_encoder_bytes = encoder.parameter_bytes
            for prompt, negative in missing:
                tensors = encoder.encode(prompt, negative)
                blob = embedding_to_bytes(
                    tensors, {"model": model_label(model), "encoder": encoder.identity}
                )
                key = self.key(model, prompt, negative)
                if not self.cache.put(key, model_label(model), blob):
                    result.not_stored += 1
                    result.encoded[(prompt, negative)] = blob  # used from memory, this once
                result.misses += 1
                if on_each:
                    on_each(prompt)
        finally:
            encoder.unload()
        log.info(
            "prompts.encoded",
            extra={"model": model_label(model), "hits": result.hits, "misses": result.misses},
        )
        return result
