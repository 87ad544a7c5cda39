"""Real open video models through diffusers, loaded from a local model directory.

Three families, one generator shape: segment 0 is text-to-video; every later segment is
conditioned on the previous segment's tail (pixel frames) and regenerates those frames as
its first `context` frames, which the stitcher then blends.

- `skyreels-v2-df`: SkyReels-V2 diffusion forcing; the extension runs the VideoToVideo
  diffusion-forcing pipeline (`addnoise_condition` keeps the tail from being copied verbatim).
- `wan`: a Wan2.1 VACE directory; the extension gives VACE the tail as its conditioning video
  with a mask that keeps those frames and generates the rest (see docs/models.md for why
  VACE rather than image-to-video from the last frame).
- `ltx-video`: LTXConditionPipeline with the tail as a video condition at frame 0 (a camera
  move: its template's frames as a video condition at frame 0 too, of the move's strength,
  given before the tail, which keeps its frames).

LoRAs named by a job (`model.lora` in the manifest) are fetched through the node's asset
cache, loaded once per process as named adapters and weighted per job (docs/models.md).

GPU workers load transformer, VAE and scheduler only; prompts arrive as embeddings made by
the text encoder alone (text_encoding.py). Weights are never downloaded: the hub is off
and a directory without the files `model_index.json` names is refused with what is missing.
Frame counts come in stride*k+1 (the VAE compresses time): a segment of L frames is
generated as the next such count >= L and trimmed; the overlap must itself be stride*k+1.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np

from factory.errors import PermanentError
from factory.generate import memory
from factory.generate.attention import Capabilities, choose
from factory.generate.base import Frames, PromptEmbedding, SegmentSpec
from factory.generate.families import Family, family_of
from factory.generate.guard import check_float_output
from factory.generate.model_dir import check_model_dir
from factory.infra import stopping
from factory.spec import ModelChoice

log = logging.getLogger(__name__)

ADDNOISE_CONDITION = 20  # SkyReels: noise level added to the conditioning tail
VACE_FILL = 0.5  # VACE: grey for the frames it is asked to generate
MAX_LOADED_LORAS = 8  # adapters kept loaded per worker process for the next jobs


def frames_for_model(frames: int, stride: int = 4) -> int:
    return frames if frames % stride == 1 else (frames // stride + 1) * stride + 1


class DiffusersGenerator:
    """The shared part: loading, attention, memory governance, seeding, output checks."""

    uses_embedding_cache = True
    carries_latents = False  # LatentGenerator: True

    def __init__(
        self,
        model: ModelChoice,
        attention_override: str | None = None,
        memory_policy: memory.MemoryPolicy | None = None,
    ) -> None:
        assert model.path is not None
        self.model = model
        self.family: Family = family_of(model.family)
        self.name = self.family.name
        self.attention_override = attention_override
        self.memory_policy = memory_policy or memory.MemoryPolicy()
        self.attention: tuple[str, str] | None = None  # (backend, reason), once loaded
        self.steps = model.steps or self.family.default_steps
        self.guidance = (
            model.guidance if model.guidance is not None else self.family.default_guidance
        )
        self.last_memory: dict[str, Any] | None = None
        self.time_stride = self.family.time_stride
        self.device = "cpu"
        self.pipe: Any = None
        self.dtype: Any = None
        self._adapters: dict[str, str] = {}  # LoRA reference -> adapter name, loaded
        self.active_loras: list[dict[str, Any]] = []

    def use_sampling(self, steps: int | None, guidance: float | None) -> None:
        """The job's denoising steps and guidance scale (the family's defaults where unset)."""
        self.steps = steps or self.family.default_steps
        self.guidance = guidance if guidance is not None else self.family.default_guidance

    def use_loras(
        self,
        loras: list[tuple[str, float]],
        open_file: Callable[[str], AbstractContextManager[Path]],
    ) -> None:
        """The job's LoRAs (reference, scale) over the base weights: each loaded once per
        process (fetched through `open_file`, the node's asset cache) and kept for the next
        jobs; the ones a job does not name are switched off, not unloaded."""
        if self.pipe is None:
            raise PermanentError(f"{self.name}: LoRAs set before load")
        if loras and self.memory_policy.layerwise_casting != "off":
            raise PermanentError(
                f"{self.name}: LoRAs cannot be applied over float8 weights; unset "
                "FACTORY_LAYERWISE_CASTING on the workers that run LoRA jobs"
            )
        names = [self._adapter(reference, open_file) for reference, _ in loras]
        if names:
            self.pipe.enable_lora()
            self.pipe.set_adapters(names, adapter_weights=[scale for _, scale in loras])
        elif self._adapters:
            self.pipe.disable_lora()
        self.active_loras = [{"asset": ref, "scale": scale} for ref, scale in loras]
        self._forget_adapters(keep=set(names))

    def _adapter(
        self, reference: str, open_file: Callable[[str], AbstractContextManager[Path]]
    ) -> str:
        if reference in self._adapters:
            return self._adapters[reference]
        name = "lora_" + hashlib.sha256(reference.encode()).hexdigest()[:16]
        with open_file(reference) as path, tempfile.TemporaryDirectory() as folder:
            # Safetensors only: the cached copy has no extension, and given a file diffusers
            # cannot name as .safetensors it falls back to torch.load, i.e. unpickling.
            named = Path(folder) / "lora.safetensors"
            named.symlink_to(path)
            try:
                self.pipe.load_lora_weights(
                    folder, weight_name=named.name, use_safetensors=True, adapter_name=name
                )
            except Exception as error:
                reason = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
                raise PermanentError(
                    f"{self.name}: LoRA {reference} does not fit this model "
                    f"({self.model.path}): {type(error).__name__}: {reason}"
                ) from error
        loaded = {a for adapters in self.pipe.get_list_adapters().values() for a in adapters}
        if name not in loaded:  # diffusers skips keys it does not recognise, silently
            raise PermanentError(
                f"{self.name}: LoRA {reference} does not fit this model ({self.model.path}): "
                "none of its weights names a layer of this model's transformer"
            )
        self._adapters[reference] = name
        log.info("lora.loaded", extra={"asset": reference, "adapter": name})
        return name

    def _forget_adapters(self, keep: set[str]) -> None:
        """At most MAX_LOADED_LORAS stay loaded: the oldest unused ones go first."""
        for reference in list(self._adapters):
            if len(self._adapters) <= MAX_LOADED_LORAS:
                return
            if self._adapters[reference] not in keep:
                self.pipe.delete_adapters([self._adapters.pop(reference)])

    # -- loading ---------------------------------------------------------------------------

    def load(self, device: str) -> None:
        os.environ["HF_HUB_OFFLINE"] = "1"  # never a download, whatever the caller's environment
        os.environ["TRANSFORMERS_OFFLINE"] = "1"
        check_model_dir(self.model.path or "", self.family.generation_components)
        memory.configure_allocator()
        import diffusers
        import torch
        from diffusers.utils import logging as diffusers_logging

        diffusers_logging.disable_progress_bar()
        diffusers_logging.set_verbosity_error()
        self.device = device
        self.dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        pipeline_class = getattr(diffusers, self.pipeline_class_name())
        pipe = pipeline_class.from_pretrained(
            self.model.path,
            dtype=self.dtype,
            local_files_only=True,
            text_encoder=None,
            tokenizer=None,
        )
        pipe.set_progress_bar_config(disable=True)
        self.memory_policy.apply(pipe, device, self.dtype)
        self.pipe = pipe
        self.time_stride = self._time_stride(pipe)
        if self.fixed_attention:
            self.attention = self.fixed_attention
        else:
            self.attention = choose(
                Capabilities.probe(device),
                dense_mask=self.needs_dense_mask,
                override=self.attention_override,
            )
            pipe.transformer.set_attention_backend(self.attention[0])
        log.info(
            "attention.chosen", extra={"backend": self.attention[0], "reason": self.attention[1]}
        )
        self._after_load(pipe)

    needs_dense_mask = False  # synchronous diffusion forcing / plain DiT attention
    fixed_attention: tuple[str, str] | None = None  # a model that runs on one backend only

    def pipeline_class_name(self) -> str:
        """The diffusers pipeline this directory is loaded as (a family with variants reads
        it from the directory)."""
        return self.family.text_pipeline

    def _after_load(self, pipe: Any) -> None:
        pass

    def _time_stride(self, pipe: Any) -> int:
        return int(getattr(pipe, "vae_scale_factor_temporal", self.family.time_stride))

    # -- prompts ---------------------------------------------------------------------------

    def encode_prompt(self, prompt: str, negative_prompt: str = "") -> PromptEmbedding:
        """Without the cache: the text encoder alone, on the CPU, loaded for this and freed."""
        from factory.generate.text_encoding import TextEncoder

        encoder = TextEncoder(self.model)
        encoder.load("cpu")
        try:
            return self.embedding(prompt, negative_prompt, encoder.encode(prompt, negative_prompt))
        finally:
            encoder.unload()

    def embedding(self, prompt: str, negative: str, tensors: dict[str, Any]) -> PromptEmbedding:
        return PromptEmbedding(self.name, prompt, negative, tensors)

    def _embeddings_on_device(self, prompt: PromptEmbedding) -> dict[str, Any]:
        out = {}
        for name, tensor in prompt.data.items():
            dtype = self.dtype if tensor.is_floating_point() else tensor.dtype
            out[name] = tensor.to(self.device, dtype)
        return out

    # -- generation ------------------------------------------------------------------------

    def generate(
        self, seg: SegmentSpec, prompt: PromptEmbedding, context: Frames | None, seed: int
    ) -> Frames:
        import torch

        if self.pipe is None:
            raise PermanentError(f"{self.name}: generate called before load")
        stride = self.time_stride
        if context is not None and seg.context and seg.context % stride != 1:
            raise PermanentError(
                f"{self.name}: the overlap must be {stride}k+1 frames, got {seg.context}"
            )
        count = frames_for_model(seg.frames, stride)
        embeds = self._embeddings_on_device(prompt)
        extend = context is not None and seg.context > 0

        def run() -> Any:
            generator = torch.Generator("cpu").manual_seed(seed)
            return self._run(seg, count, embeds, context if extend else None, generator)

        video = self._measured(seg, f"{count} frames", seed, run)
        return self._as_frames(video, seg)[: seg.frames]

    def _measured(self, seg: SegmentSpec, size: str, seed: int, run: Callable[[], Any]) -> Any:
        """`run()` with its memory measured into `last_memory`, torch's global generator seeded
        inside a forked RNG state (some steps draw from it: a resumed job must make the same
        frames), and an out-of-memory error retried once with the cache emptied and VAE
        tiling on."""
        import torch

        oom_retries = 0
        with memory.measure(self.device) as reading:
            while True:
                try:
                    with torch.random.fork_rng(devices=[]), torch.no_grad():
                        torch.manual_seed(seed)
                        result = run()
                    break
                except Exception as error:
                    if not memory.is_out_of_memory(error):
                        raise
                    if oom_retries:
                        raise PermanentError(
                            f"{self.name}: out of GPU memory at {seg.width}x{seg.height}, "
                            f"{size}, even after emptying the cache with VAE tiling on; "
                            "set FACTORY_GROUP_OFFLOAD=block or shorten segment.frames"
                        ) from error
                    oom_retries += 1
                    log.warning("segment.oom_retry", extra={"segment": seg.index})
                    memory.release_cached(self.device)
                    self.pipe.vae.enable_tiling()
        reading.extra.update(oom_retries=oom_retries, **self.memory_policy.describe(self.device))
        self.last_memory = reading.to_dict()
        return result

    def _as_frames(self, video: Any, seg: SegmentSpec) -> Frames:
        """Checked model output in 0..1 as uint8 frames, C-ordered."""
        video = np.asarray(video, np.float32)
        check_float_output(video, f"{self.name} segment {seg.index}")
        return np.ascontiguousarray(np.clip(np.rint(video * 255), 0, 255).astype(np.uint8))

    def _run(
        self,
        seg: SegmentSpec,
        count: int,
        embeds: dict[str, Any],
        context: Frames | None,
        generator: Any,
    ) -> Any:
        raise NotImplementedError

    def _common(self, seg: SegmentSpec, count: int, embeds: dict[str, Any], generator: Any):
        return dict(
            prompt=None,
            height=seg.height,
            width=seg.width,
            num_frames=count,
            num_inference_steps=self.steps,
            guidance_scale=self.guidance,
            output_type="np",
            generator=generator,
            callback_on_step_end=_stop_between_steps,
            **embeds,
        )


def _stop_between_steps(_pipe: Any, _step: int, _timestep: Any, values: dict) -> dict:
    """A worker that lost its job (its heartbeat learned it) stops after this step."""
    stopping.check()
    return values


def _pictures(frames: Frames) -> list[Any]:
    from PIL import Image

    return [Image.fromarray(frame) for frame in frames]


def _first_frame(seg: SegmentSpec) -> Any | None:
    """The picture a shot starts from (SegmentSpec.image), as PIL, for a segment that starts
    from nothing; None otherwise."""
    if seg.image is None or seg.image_role != "first-frame":
        return None
    from PIL import Image

    return Image.fromarray(seg.image)


def _reference(seg: SegmentSpec) -> list[Any] | None:
    """The scene's reference picture as the list VACE takes; None without one."""
    if seg.image is None or seg.image_role != "reference":
        return None
    from PIL import Image

    return [Image.fromarray(seg.image)]


class SkyReelsDiffusionForcing(DiffusersGenerator):
    def _after_load(self, pipe: Any) -> None:
        from diffusers import (
            SkyReelsV2DiffusionForcingImageToVideoPipeline,
            SkyReelsV2DiffusionForcingVideoToVideoPipeline,
        )

        self.extend_pipe = SkyReelsV2DiffusionForcingVideoToVideoPipeline(**pipe.components)
        self.extend_pipe.set_progress_bar_config(disable=True)
        # A shot that starts from a picture: the same weights, image-to-video.
        self.image_pipe = SkyReelsV2DiffusionForcingImageToVideoPipeline(**pipe.components)
        self.image_pipe.set_progress_bar_config(disable=True)

    def _run(self, seg, count, embeds, context, generator):  # type: ignore[no-untyped-def]
        common = self._common(seg, count, embeds, generator)
        common.update(base_num_frames=count, addnoise_condition=ADDNOISE_CONDITION)
        if context is None and (picture := _first_frame(seg)) is not None:
            return self.image_pipe(image=picture, **common).frames[0]
        if context is None:
            return self.pipe(**common).frames[0]
        overlap = seg.context
        out = self.extend_pipe(
            video=_pictures(context[-overlap:]), overlap_history=overlap, **common
        )
        return out.frames[0][overlap:]  # it returns the input tail, then its own frames


class WanVace(DiffusersGenerator):
    def _run(self, seg, count, embeds, context, generator):  # type: ignore[no-untyped-def]
        from PIL import Image

        common = self._common(seg, count, embeds, generator)
        if (references := _reference(seg)) is not None:
            common["reference_images"] = references  # the scene's picture, every segment
        picture = _first_frame(seg) if context is None else None
        if context is None and picture is None and seg.control is None:
            return self.pipe(**common).frames[0]
        kept = [] if context is None else _pictures(context[-seg.context :])
        kept = [picture] if picture is not None else kept
        size = (seg.width, seg.height)
        fill = Image.new("RGB", size, (round(255 * VACE_FILL),) * 3)
        if seg.control is not None:  # a camera move: its frames are VACE's control frames
            control = _pictures(seg.control)
            control += control[-1:] * max(0, count - len(control))
            video = kept + control[len(kept) : count]
            common["conditioning_scale"] = seg.control_strength
        else:
            video = kept + [fill] * (count - len(kept))
        # Black keeps a frame (the tail, or the shot's first picture), white asks VACE to
        # generate it.
        mask = [Image.new("L", size, 0)] * len(kept) + [Image.new("L", size, 255)] * (
            count - len(kept)
        )
        return self.pipe(video=video, mask=mask, **common).frames[0]


class LtxCondition(DiffusersGenerator):
    def _time_stride(self, pipe: Any) -> int:
        return int(pipe.vae_temporal_compression_ratio)

    def _run(self, seg, count, embeds, context, generator):  # type: ignore[no-untyped-def]
        from diffusers.pipelines.ltx.pipeline_ltx_condition import LTXVideoCondition

        common = self._common(seg, count, embeds, generator)
        common.update(frame_rate=seg.fps, max_sequence_length=self.family.max_sequence_length)
        # A camera move: the template's frames, one per generated frame (the last one held to
        # the model's 8k+1 count), as a video condition at frame 0 of `control_strength`.
        # It goes first: the pipeline applies conditions in order, each setting the latent
        # frames it covers and their mask, so the tail (or the shot's first picture) given
        # after it keeps the frames it conditions at strength 1, as without a camera move.
        moved = [] if seg.control is None else [_ltx_control(seg, count, LTXVideoCondition)]
        if context is None and (picture := _first_frame(seg)) is not None:
            start = LTXVideoCondition(image=picture, frame_index=0, strength=1.0)
            return self.pipe(conditions=[*moved, start], **common).frames[0]
        if context is None and not moved:
            return self.pipe(**common).frames[0]
        if context is None:
            return self.pipe(conditions=moved, **common).frames[0]
        condition = LTXVideoCondition(
            video=_pictures(context[-seg.context :]), frame_index=0, strength=1.0
        )
        return self.pipe(conditions=[*moved, condition], **common).frames[0]


def _ltx_control(seg: SegmentSpec, count: int, condition: Any) -> Any:
    """The segment's camera-move frames as an LTX video condition over all `count` frames."""
    frames = _pictures(seg.control[:count])
    frames += frames[-1:] * max(0, count - len(frames))
    return condition(video=frames, frame_index=0, strength=float(seg.control_strength))


GENERATORS: dict[str, type[DiffusersGenerator]] = {
    "skyreels-v2-df": SkyReelsDiffusionForcing,
    "wan": WanVace,
    "ltx-video": LtxCondition,
}
