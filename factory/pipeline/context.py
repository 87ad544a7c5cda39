"""What every stage function needs, built once per process."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from factory.config import Settings
from factory.db.session import Database
from factory.db.state import JobStateMachine
from factory.errors import PermanentError
from factory.generate import Generator, MemoryPolicy, PromptEmbedding, make_generator
from factory.infra.confinement import Confinement
from factory.job import Job
from factory.media.control import Template, load_template
from factory.media.images import ImageProblem, load_image
from factory.pipeline.prompts import EnsureResult, PromptService, open_embedding_cache
from factory.qc.thresholds import QcThresholds
from factory.spec import DIFFUSERS_FAMILIES, ModelChoice, VideoSpec
from factory.store import open_store
from factory.store.assets import AssetCache, open_asset_cache
from factory.store.base import Store

PICTURES_KEPT = 16  # decoded scene pictures a worker keeps
TEMPLATES_KEPT = 2  # decoded camera-move templates (a few hundred MB at most)


@dataclass
class StageContext:
    machine: JobStateMachine
    store: Store
    work_root: Path  # local scratch space (concat lists, temporary files)
    stitch_strength: float = 1.0
    drift_factor: float = 0.0  # pull each segment's colours toward the first segment's (0..1)
    device: str = "cpu"
    attention_override: str | None = None  # FACTORY_ATTENTION_BACKEND
    memory_policy: MemoryPolicy = field(default_factory=MemoryPolicy)
    prompt_service: PromptService | None = None  # the embedding cache (diffusers families)
    assets: AssetCache | None = None  # audio beds and other referenced files, node-local
    confinement: Confinement = field(default_factory=Confinement)  # where specs may point
    qc: QcThresholds = field(default_factory=QcThresholds)  # seam limits, regenerations
    on_segment: Callable[[Job, int], None] | None = None  # e.g. start encoding a ready chunk
    heartbeat_every: float = 30.0  # FACTORY_HEARTBEAT_EVERY, for stages run in-process
    stale_after: float = 300.0  # FACTORY_STALE_AFTER
    _generators: dict[ModelChoice, Generator] = field(default_factory=dict)
    _prompts: dict[tuple[ModelChoice, str, str], PromptEmbedding] = field(default_factory=dict)
    _fresh: dict[tuple[ModelChoice, str, str], bytes] = field(default_factory=dict)
    _ensured: set[tuple[ModelChoice, str, str]] = field(default_factory=set)
    _pictures: dict[tuple[str, int, int, str], Any] = field(default_factory=dict)
    _templates: dict[tuple[str, int, int, int, str], Any] = field(default_factory=dict)

    @classmethod
    def from_settings(
        cls, settings: Settings, machine: JobStateMachine, database: Database, **overrides: Any
    ) -> StageContext:
        store = open_store(settings.store_url, settings.s3, durable=settings.store_fsync)
        cache = open_embedding_cache(settings, database, store)
        values: dict[str, Any] = dict(
            machine=machine,
            store=store,
            work_root=settings.home / "work",
            attention_override=settings.attention_backend,
            drift_factor=settings.drift_factor,
            memory_policy=settings.memory_policy,
            qc=settings.qc,
            prompt_service=PromptService(cache, settings.text_encoder_device) if cache else None,
            assets=open_asset_cache(settings, store),
            confinement=settings.confinement,
            heartbeat_every=settings.heartbeat_every,
            stale_after=settings.stale_after,
        )
        values.update(overrides)
        return cls(**values)

    def generator(self, model: ModelChoice) -> Generator:
        """One generator per model directory, loaded once and kept warm for the next segments;
        sampling settings (steps, guidance) vary per job without loading the weights again.
        A model directory outside FACTORY_MODEL_ROOTS is refused before anything is read."""
        self.confinement.check_model(model.path)
        weights = replace(model, steps=None, guidance=None, loras=())
        if weights not in self._generators:
            generator = make_generator(weights, self.attention_override, self.memory_policy)
            generator.load(self.device)
            self._generators[weights] = generator
        generator = self._generators[weights]
        if hasattr(generator, "use_sampling"):
            generator.use_sampling(model.steps, model.guidance)
        if hasattr(generator, "use_loras"):
            generator.use_loras([(lora.asset, lora.scale) for lora in model.loras], self._asset)
        return generator

    def picture(self, reference: str, width: int, height: int, fit: str) -> np.ndarray:
        """A scene's picture at the frame size (factory/media/images.py), decoded once per
        worker: every segment of a scene with a reference picture asks for it."""
        key = (reference, width, height, fit)
        if key not in self._pictures:
            with self._asset(reference) as path:
                try:
                    self._pictures[key] = load_image(path, width, height, fit)
                except ImageProblem as exc:
                    raise PermanentError(f"{reference} {exc}") from None
            while len(self._pictures) > PICTURES_KEPT:
                self._pictures.pop(next(iter(self._pictures)))
        return self._pictures[key]

    def template(self, reference: str, video: VideoSpec) -> Template:
        """A camera-move template at the video's fps and frame size, with its motion track,
        decoded once per worker (every segment of its scene asks for it)."""
        key = (reference, video.width, video.height, video.fps, video.image_fit)
        if key not in self._templates:
            with self._asset(reference) as path:
                try:
                    self._templates[key] = load_template(
                        path, video.width, video.height, video.fps, video.image_fit
                    )
                except (ValueError, OSError) as exc:
                    raise PermanentError(f"{reference} does not decode as video: {exc}") from None
            while len(self._templates) > TEMPLATES_KEPT:
                self._templates.pop(next(iter(self._templates)))
        return self._templates[key]

    def _asset(self, reference: str) -> AbstractContextManager[Path]:
        if self.assets is None:
            raise PermanentError("no asset cache configured for this worker")
        return self.assets.local_path(reference)

    def ensure_prompts(self, video: VideoSpec) -> EnsureResult | None:
        """Before a job's first segment (and after any cold start): the job's prompts encoded
        by the text encoder alone, unless the cache has them. None when nothing was needed."""
        model = video.model
        if model.family not in DIFFUSERS_FAMILIES or self.prompt_service is None:
            return None
        self.confinement.check_model(model.path)
        pairs = [(s.prompt, video.negative_prompt) for s in video.scenes]
        pairs = [p for p in pairs if (model, *p) not in self._ensured]
        if not pairs:
            return None
        result = self.prompt_service.ensure(model, pairs)
        for (text, negative), blob in result.encoded.items():
            self._fresh[(model, text, negative)] = blob
        self._ensured.update((model, *p) for p in pairs)
        return result

    def prompt(self, model: ModelChoice, text: str, negative: str) -> PromptEmbedding:
        """Prompt embeddings, kept per process for each (model, prompt, negative)."""
        key = (model, text, negative)
        if key in self._prompts:
            return self._prompts[key]
        generator = self.generator(model)
        if model.family in DIFFUSERS_FAMILIES and self.prompt_service is not None:
            from factory.generate.text_encoding import embedding_from_bytes

            blob = self._fresh.pop(key, None) or self.prompt_service.lookup(model, text, negative)
            if blob is None:  # not ensured yet: encode it now (kept in memory if too large)
                result = self.prompt_service.ensure(model, [(text, negative)])
                blob = result.encoded.get((text, negative)) or self.prompt_service.lookup(
                    model, text, negative
                )
            if blob is None:
                raise PermanentError(f"prompt embedding for {text[:40]!r} could not be cached")
            embedding = generator.embedding(text, negative, embedding_from_bytes(blob))  # type: ignore[attr-defined]
        else:
            embedding = generator.encode_prompt(text, negative)
        self._prompts[key] = embedding
        return embedding

    def work_dir(self, video: VideoSpec) -> Path:
        path = self.work_root / video.batch / video.video_id
        path.mkdir(parents=True, exist_ok=True)
        return path
