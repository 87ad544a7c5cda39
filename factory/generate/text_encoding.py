"""The text encoder on its own: tokenizer + text encoder of a diffusers model directory, without
the transformer or the VAE, so prompts are encoded ahead of generation (`factory preload`,
or once before a job's first segment) and GPU workers never hold the text encoder.

The embeddings are made by the family pipeline's own `encode_prompt`, so they are exactly
what the full pipeline would compute; negative embeddings are always made (the cache entry
does not depend on the guidance scale)."""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from factory.errors import PermanentError
from factory.generate.families import Family, family_of
from factory.generate.model_dir import check_model_dir
from factory.spec import ModelChoice

log = logging.getLogger(__name__)

TEXT_COMPONENTS = ("text_encoder", "tokenizer")
_TOKENIZER_FILES = (".json", ".model", ".txt")

loads = 0  # how many times this process loaded a text encoder (tests read it)


def text_encoder_identity(path: str) -> str:
    """What distinguishes one text encoder from another without reading gigabytes of weights
    (nor needing them: a GPU node may hold the directory without them): its config and
    tokenizer files. Two model directories with the same encoder (Wan and Helios both ship
    umt5-xxl) have the same identity; a fine-tuned encoder must differ in its config (its
    `_name_or_path`, for one) to be told apart."""
    root = Path(path)
    check_model_dir(path, TEXT_COMPONENTS)
    digest = hashlib.sha256()
    for folder in TEXT_COMPONENTS:
        for file in sorted((root / folder).iterdir()):
            if file.suffix in _TOKENIZER_FILES:
                digest.update(f"{folder}/{file.name}\0".encode())
                digest.update(file.read_bytes())
    return digest.hexdigest()[:32]


def text_pipeline_class(path: str, family: Family) -> str:
    """The pipeline class whose encode_prompt runs: a family with variants (Helios: base or
    pyramid) is loaded as the class its model_index.json names."""
    if not family.pipelines:
        return family.text_pipeline
    try:
        named = json.loads((Path(path) / "model_index.json").read_text()).get("_class_name")
    except (OSError, ValueError):
        named = None
    return named if named in family.pipelines else family.text_pipeline


class TextEncoder:
    def __init__(self, model: ModelChoice) -> None:
        assert model.path is not None
        self.model = model
        self.family: Family = family_of(model.family)
        self.identity = text_encoder_identity(model.path)
        self.max_length = self.family.max_sequence_length
        self._pipe: Any = None
        self.device = "cpu"

    def load(self, device: str = "cpu") -> None:
        global loads
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["TRANSFORMERS_OFFLINE"] = "1"
        import diffusers
        import torch

        loads += 1
        pipeline_class = getattr(diffusers, text_pipeline_class(self.model.path or "", self.family))
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        skip = {name: None for name in self.family.generation_components}
        self._pipe = pipeline_class.from_pretrained(
            self.model.path, dtype=dtype, local_files_only=True, **skip
        )
        self._pipe.text_encoder.to(device)
        self.device = device
        log.info("text_encoder.loaded", extra={"model": self.model.path, "device": device})

    @property
    def parameter_bytes(self) -> int:
        encoder = self._loaded().text_encoder
        return sum(p.numel() * p.element_size() for p in encoder.parameters())

    def encode(self, prompt: str, negative_prompt: str) -> dict[str, Any]:
        """Named tensors on the CPU in float32, ready to serialise."""
        import torch

        pipe = self._loaded()
        with torch.no_grad():
            out = pipe.encode_prompt(
                prompt=prompt,
                negative_prompt=negative_prompt or "",
                do_classifier_free_guidance=True,
                num_videos_per_prompt=1,
                max_sequence_length=self.max_length,
                device=torch.device(self.device),
            )
        return {
            name: tensor.detach().to("cpu", torch.float32).contiguous()
            for name, tensor in zip(self.family.embedding_names, out, strict=True)
        }

    def unload(self) -> None:
        self._pipe = None
        gc.collect()
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()

    def _loaded(self) -> Any:
        if self._pipe is None:
            raise PermanentError("text encoder used before load")
        return self._pipe


def embedding_to_bytes(tensors: dict[str, Any], meta: dict[str, str]) -> bytes:
    from safetensors.torch import save

    return save(tensors, metadata={k: str(v) for k, v in meta.items()})


def embedding_from_bytes(data: bytes) -> dict[str, Any]:
    from safetensors.torch import load

    try:
        return load(data)
    except Exception as error:  # a truncated or foreign blob is a cache miss, not a crash
        raise ValueError(f"not a prompt-embedding blob: {error}") from error


def describe(tensors: dict[str, Any]) -> str:
    return json.dumps({k: list(v.shape) for k, v in tensors.items()})
