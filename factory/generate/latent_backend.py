"""Families that continue from latents: Helios (base, mid, distilled) and AnyFlow-FAR.

Their pipelines make long video chunk by chunk, each chunk conditioned on the latents of the
chunks before it, with no other hidden state. The factory runs one segment (whole chunks) per
task and persists what the next segment needs as a *carry* (safetensors, stored beside the
segment), so a cold worker continues exactly where the last one stopped:

- helios: the anchor latent (the video's first latent frame), the last history window of
  latent frames (16 + 2 + 1) and the state of the noise generator. Continuing with noise on
  the history off (it is clean, not an encoded clip), the anchor given, and the generator
  state restored gives the same latents as one pipeline call of the whole length, bit for bit.
- anyflow-far: the last latent frames that fit the checkpoint's window (the sum of its tuned
  `chunk_partition`) with the chunk partition they were made in; each segment's noise comes
  from its own seed (the pipeline draws one channel-major tensor whose layout depends on the
  total length, so per-segment noise is what a segment can own). While the history fits the
  window the segments equal one call given the same noise, bit for bit; past it the context
  slides (what the checkpoint was tuned for) and resuming stays exact.

A shot that starts from a picture (a scene's `first-frame`, SegmentSpec.image): Helios takes it
as its image-to-video does: the picture's latent is the anchor of every chunk of the shot
(carried as the anchor, so the shot's later segments keep it) and the picture held for a
chunk is the history before its first chunk (carried at the head of the history), both
encoded and noised as the pipeline does with `image=`: the segments equal one `image=` call
of the whole length. AnyFlow-FAR takes it as its image-to-video does, a 1-frame `video=`
context that fills the partition's first chunk (1 latent frame): the segment's first latent
frame is the picture's, carried like any other.

Decoding: the pipelines decode each chunk on its own (the chunk's first latent frame becomes
one picture), which leaves a visible seam every chunk. The factory decodes a segment's new
latents after `decode_context` latent frames of the previous segment, so the causal VAE runs
warm across the join; the re-decoded frames before the join are the plan's overlap, which the
stitcher cross-fades with the previous segment's own. The video's first latent frame decodes
to one picture: it is held for the 4 frames every other latent frame spans, so time stays
uniform (segment 0 is `overlap` frames shorter: factory.plan.segments).
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import contextmanager
from typing import Any, ClassVar

import numpy as np

from factory.errors import PermanentError
from factory.generate.base import Frames, PromptEmbedding, SegmentSpec
from factory.generate.diffusers_backend import (
    DiffusersGenerator,
    _first_frame,
    _stop_between_steps,
)
from factory.generate.model_dir import PYRAMID_SIZE_MULTIPLE, helios_variant

log = logging.getLogger(__name__)

HELIOS_HISTORY = (16, 2, 1)  # latent frames of long, mid and short history (the released)
# The noise Helios's image-to-video puts on an encoded picture (sigma drawn in this range; the
# pipelines' `image_noise_sigma_*` and, on the picture held for a chunk, `video_noise_sigma_*`).
HELIOS_PICTURE_NOISE = (0.111, 0.135)
HELIOS_HELD_NOISE = (0.111, 0.135)
CARRY_VERSION = "1"


# -- carries -------------------------------------------------------------------------------


def carry_to_bytes(tensors: dict[str, Any], meta: dict[str, Any]) -> bytes:
    from safetensors.torch import save

    data = {name: tensor.detach().to("cpu").contiguous() for name, tensor in tensors.items()}
    return save(data, metadata={"version": CARRY_VERSION, "meta": json.dumps(meta)})


def carry_from_bytes(data: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
    from safetensors.torch import load

    try:
        tensors = load(data)
        size = int.from_bytes(data[:8], "little")  # safetensors: header length, then header
        header = json.loads(data[8 : 8 + size]).get("__metadata__", {})
        meta = json.loads(header.get("meta", "{}"))
    except Exception as error:
        raise PermanentError(f"the stored latent carry cannot be read: {error}") from error
    return tensors, meta


# -- the shared part -----------------------------------------------------------------------


class LatentGenerator(DiffusersGenerator):
    """A segment = whole chunks of latents continued from the carry, decoded warm."""

    carries_latents = True
    last_phases: dict[str, Any] | None = None

    def adopt(self, pipe: Any, device: str) -> None:
        """Use a pipeline built in memory (the GPU check's random real-size weights, which are
        too large to save and load again) as if `load` had made it."""
        import torch

        self.pipe, self.device = pipe, device
        self.dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        self.time_stride = self._time_stride(pipe)
        pipe.set_progress_bar_config(disable=True)
        self.attention = self.fixed_attention or ("native", "adopted pipeline")
        self._after_load(pipe)

    def generate(
        self, seg: SegmentSpec, prompt: PromptEmbedding, context: Frames | None, seed: int
    ) -> Frames:
        raise PermanentError(f"{self.name} continues from latents: use generate_continuing")

    def generate_continuing(
        self,
        seg: SegmentSpec,
        prompt: PromptEmbedding,
        carry: bytes | None,
        seed: int,
        reseed: bool = False,
    ) -> tuple[Frames, bytes]:
        """The segment's frames (its re-decoded overlap first, for segments after the first)
        and the carry for the next one. `reseed`: draw this segment's noise from `seed` even
        where the chain would continue (a QC regeneration)."""
        import torch

        if self.pipe is None:
            raise PermanentError(f"{self.name}: generate called before load")
        new = self.new_latent_frames(seg)
        if not seg.starts_shot and carry is None:
            raise PermanentError(f"{self.name}: segment {seg.index} has no carry to continue")
        state, meta = carry_from_bytes(carry) if carry is not None else ({}, {})
        self._check_carry(seg, meta)
        embeds = self._embeddings_on_device(prompt)
        previous = state.get("latents")
        phases: dict[str, Any] = {}

        def run() -> tuple[Any, dict[str, Any], np.ndarray]:
            started = time.perf_counter()
            latents, extra = self._latents(seg, new, embeds, state, seed, reseed)
            _synchronize(self.device)
            denoised = time.perf_counter()
            frames = self._decode(seg, previous, latents)
            _synchronize(self.device)
            phases["denoise_seconds"] = round(denoised - started, 4)
            phases["decode_seconds"] = round(time.perf_counter() - denoised, 4)
            return latents, extra, frames

        latents, extra, frames = self._measured(seg, f"{new} latent frames", seed, run)
        # What the next segment's history starts with: the latents carried in, or for a shot
        # that started from a picture, what its first call had before its own (Helios: the
        # picture held for a chunk).
        before = extra.pop("before", None) if previous is None else previous
        history = latents if before is None else torch.cat([before.to(latents), latents], 2)
        keep = max(self.history_latents(new), self.family.decode_context)
        tensors = {"latents": history[:, :, -keep:].float(), **extra}
        carried = carry_to_bytes(
            tensors,
            {
                "family": self.name,
                "segment": seg.index,
                "width": seg.width,
                "height": seg.height,
                "generated": int(meta.get("generated", 0)) + new,
            },
        )
        self.last_phases = {**phases, "carry_bytes": len(carried)}
        assert self.last_memory is not None
        self.last_memory["phases"] = self.last_phases
        video = self._as_frames(frames, seg)
        if len(video) != seg.frames:
            raise PermanentError(
                f"{self.name} segment {seg.index}: decoded {len(video)} frames, planned "
                f"{seg.frames}"
            )
        return video, carried

    def new_latent_frames(self, seg: SegmentSpec) -> int:
        stride, chunk = self.time_stride, self.family.chunk_latents
        new_frames = seg.frames - seg.context
        if new_frames <= 0 or new_frames % (stride * chunk):
            raise PermanentError(
                f"{self.name}: segment {seg.index} of {seg.frames} frames (overlap "
                f"{seg.context}) is not whole chunks of {stride * chunk} frames"
            )
        if seg.context > self.family.max_overlap:
            raise PermanentError(
                f"{self.name}: an overlap of {seg.context} frames is more than the "
                f"{self.family.max_overlap} frames decoded again warm"
            )
        return new_frames // stride

    def history_latents(self, new: int) -> int:
        """Latent frames of history the next segment conditions on."""
        raise NotImplementedError

    def _check_carry(self, seg: SegmentSpec, meta: dict[str, Any]) -> None:
        if not meta:
            return
        if meta.get("family") != self.name or (meta.get("width"), meta.get("height")) != (
            seg.width,
            seg.height,
        ):
            raise PermanentError(
                f"{self.name} segment {seg.index}: the stored carry was made by "
                f"{meta.get('family')} at {meta.get('width')}x{meta.get('height')}"
            )
        if int(meta.get("segment", -1)) != seg.index - 1:
            raise PermanentError(
                f"{self.name} segment {seg.index}: the carry given is segment "
                f"{meta.get('segment')}'s, not segment {seg.index - 1}'s"
            )

    def _latents(
        self,
        seg: SegmentSpec,
        new: int,
        embeds: dict[str, Any],
        state: dict[str, Any],
        seed: int,
        reseed: bool,
    ) -> tuple[Any, dict[str, Any]]:
        raise NotImplementedError

    # -- decoding --------------------------------------------------------------------------

    def _decode(self, seg: SegmentSpec, previous: Any, latents: Any) -> np.ndarray:
        """[T, H, W, 3] float 0..1: the new latents decoded after the previous segment's last
        `decode_context` latent frames, keeping the overlap and the new frames."""
        import torch

        vae = self.pipe.vae
        stride = self.time_stride
        if previous is None:
            window = latents
        else:
            context = previous[:, :, -self.family.decode_context :].to(latents)
            window = torch.cat([context, latents], 2)
        mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
        std = 1.0 / torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
        window = window.to(self.device, vae.dtype)
        video = vae.decode(window / std.to(window) + mean.to(window), return_dict=False)[
            0
        ]  # [B, C, T, H, W] in -1..1
        frames = ((video[0].float().clamp(-1, 1) + 1) / 2).permute(1, 2, 3, 0).cpu().numpy()
        new_frames = latents.shape[2] * stride
        if previous is None:
            hold = np.repeat(frames[:1], stride - 1, axis=0)  # the first picture's 4 frames
            return np.concatenate([hold, frames])
        return frames[-(new_frames + seg.context) :]


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


# -- Helios --------------------------------------------------------------------------------


class Helios(LatentGenerator):
    """Helios base (HeliosPipeline), mid (pyramid, CFG-Zero*) and distilled (pyramid, DMD)."""

    variant = "base"
    VARIANT_STEPS: ClassVar = {"base": 50, "mid": 20, "distilled": 2}  # per pyramid stage
    VARIANT_GUIDANCE: ClassVar = {"base": 5.0, "mid": 5.0, "distilled": 1.0}

    def pipeline_class_name(self) -> str:
        self.variant = helios_variant(self.model.path or "")
        return "HeliosPipeline" if self.variant == "base" else "HeliosPyramidPipeline"

    def new_latent_frames(self, seg: SegmentSpec) -> int:
        multiple = PYRAMID_SIZE_MULTIPLE
        if self.variant != "base" and (seg.width % multiple or seg.height % multiple):
            raise PermanentError(
                f"{self.name} {self.variant} (pyramid): {seg.width}x{seg.height} does not suit "
                f"it; width and height must be multiples of {multiple} (e.g. 640x384)"
            )
        return super().new_latent_frames(seg)

    def _after_load(self, pipe: Any) -> None:
        self.use_sampling(self.model.steps, self.model.guidance)

    def use_sampling(self, steps: int | None, guidance: float | None) -> None:
        self.steps = steps or self.VARIANT_STEPS[self.variant]
        self.guidance = guidance if guidance is not None else self.VARIANT_GUIDANCE[self.variant]

    def history_latents(self, new: int) -> int:
        return sum(HELIOS_HISTORY)

    def _latents(self, seg, new, embeds, state, seed, reseed):  # type: ignore[no-untyped-def]
        import torch

        chunk = self.family.chunk_latents
        generator = torch.Generator("cpu")
        if seg.starts_shot or reseed:
            generator.manual_seed(seed)
        else:
            generator.set_state(state["rng"])
        kwargs: dict[str, Any] = dict(
            prompt_embeds=embeds["prompt_embeds"],
            negative_prompt_embeds=embeds.get("negative_prompt_embeds"),
            height=seg.height,
            width=seg.width,
            num_frames=new // chunk * ((chunk - 1) * self.time_stride + 1),  # 33 per chunk
            guidance_scale=self.guidance,
            generator=generator,
            output_type="latent",
            history_sizes=list(HELIOS_HISTORY),
            num_latent_frames_per_chunk=chunk,
            keep_first_frame=True,
            callback_on_step_end=_stop_between_steps,
        )
        if self.variant == "base":
            kwargs["num_inference_steps"] = self.steps
        else:
            stages = int(self.pipe.scheduler.config.get("stages", 3))
            kwargs["pyramid_num_inference_steps_list"] = [self.steps] * stages
        if self.variant == "mid":
            kwargs.update(use_zero_init=True, zero_steps=1)
        if self.variant == "distilled":
            # Amplified steps belong to a generation's first chunk only (the pipeline's own
            # rule): the video's, and each shot's, which starts from nothing as the video does.
            kwargs["is_amplify_first_chunk"] = seg.starts_shot
        picture = _first_frame(seg) if seg.starts_shot else None
        if picture is not None:
            start, held = self._picture_latents(picture, seg, generator)
            kwargs.update(image_latents=start, fake_image_latents=held,
                          add_noise_to_image_latents=False)  # fmt: skip
        if not seg.starts_shot:
            history = state["latents"][:, :, -sum(HELIOS_HISTORY) :]
            # Clean history and a given anchor: the pipeline's defaults re-noise both (for an
            # encoded clip), and without the anchor its first new latent becomes the anchor.
            kwargs.update(
                video_latents=history.to(self.device, torch.float32),
                image_latents=state["anchor"].to(self.device, torch.float32),
                add_noise_to_video_latents=False,
                add_noise_to_image_latents=False,
            )
        with _no_chunk_decode(self.pipe):
            out = self.pipe(**kwargs).frames
        latents = out[:, :, -new:]  # the output starts with the history it was given
        if picture is not None:  # the picture's latent stays the anchor of the whole shot
            anchor = kwargs["image_latents"]
        else:
            anchor = latents[:, :, :1] if seg.starts_shot else state["anchor"]
        extra = {"anchor": anchor.float(), "rng": generator.get_state()}
        if picture is not None:
            extra["before"] = kwargs["fake_image_latents"].float()
        return latents, extra

    def _picture_latents(self, picture: Any, seg: SegmentSpec, generator: Any) -> tuple[Any, Any]:
        """The shot's first picture as Helios's image-to-video (`image=`) makes it ready, with
        the pipeline's own encode (`prepare_image_latents`, drawing from `generator`) and its
        default noise on an encoded picture: the picture's latent (the anchor every chunk of
        the shot is conditioned on) and the last latent frame of the picture held for a chunk
        (the history the first chunk continues). Done here rather than by `image=` so that the
        anchor is known, to carry to the shot's later segments, and so that the noise is drawn
        from the CPU generator on any device (the pipeline's `torch.rand(device=...)` does not
        take a CPU generator on CUDA); on the CPU the draws are the pipeline's own, in order."""
        import torch
        from diffusers.utils.torch_utils import randn_tensor

        pipe, device = self.pipe, self.device
        vae = pipe.vae
        shape = (1, vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(vae.config.latents_mean).view(shape).to(device, vae.dtype)
        std = 1.0 / torch.tensor(vae.config.latents_std).view(shape).to(device, vae.dtype)
        image = pipe.video_processor.preprocess(picture, height=seg.height, width=seg.width)
        start, held = pipe.prepare_image_latents(
            image,
            latents_mean=mean,
            latents_std=std,
            num_latent_frames_per_chunk=self.family.chunk_latents,
            dtype=torch.float32,
            device=device,
            generator=generator,
        )

        def noised(latents: Any, sigmas: tuple[float, float]) -> Any:
            low, high = sigmas
            sigma = (torch.rand(1, generator=generator) * (high - low) + low).to(device)
            noise = randn_tensor(latents.shape, generator=generator, device=torch.device(device))
            return sigma * noise + (1 - sigma) * latents

        return noised(start, HELIOS_PICTURE_NOISE), noised(held, HELIOS_HELD_NOISE)


@contextmanager
def _no_chunk_decode(pipe: Any):  # type: ignore[no-untyped-def]
    """Helios decodes every chunk inside its loop even when asked for latents; the factory
    decodes warm afterwards, so the inner decode is skipped (it draws no random numbers)."""
    import torch

    vae = pipe.vae
    real = vae.decode

    def skip(latents: Any, return_dict: bool = True) -> Any:
        return (torch.zeros(latents.shape[0], 3, 1, 1, 1, device=latents.device),)

    vae.decode = skip
    try:
        yield
    finally:
        vae.decode = real


# -- AnyFlow-FAR ---------------------------------------------------------------------------


class AnyFlowFar(LatentGenerator):
    fixed_attention = ("flex", "AnyFlow-FAR's block-causal mask runs on flex attention only")

    def _after_load(self, pipe: Any) -> None:
        partition = [int(n) for n in pipe.transformer.config.get("chunk_partition") or ()]
        chunk = self.family.chunk_latents
        if len(partition) < 2 or max(partition[1:]) != chunk:
            raise PermanentError(
                f"{self.name}: {self.model.path} is tuned for the chunk partition {partition}; "
                f"the factory runs chunks of {chunk} latent frames (transformer/config.json "
                "`chunk_partition`)"
            )
        self.partition = partition
        self.window = sum(partition)  # latent frames in one call: context + new

    def history_latents(self, new: int) -> int:
        return max(self.window - new, 0)

    def _latents(self, seg, new, embeds, state, seed, reseed):  # type: ignore[no-untyped-def]
        import torch

        chunk = self.family.chunk_latents
        if new > self.window - (0 if seg.starts_shot else chunk):
            raise PermanentError(
                f"{self.name}: a segment of {new} latent frames leaves no context in the "
                f"checkpoint's window of {self.window} latent frames; shorten segment.frames"
            )
        if seg.starts_shot:
            first = self.partition[0]
            parts = (
                [first] + [chunk] * (new // chunk - 1) + ([chunk - first] if first < chunk else [])
            )
            parts = [p for p in parts if p]
            context, context_parts = None, []
        else:
            context, context_parts = _context(state, self.window - new)
            parts = [chunk] * (new // chunk)
        taken = sum(context_parts)
        picture = self._picture(seg) if seg.starts_shot else None
        h, w = (
            seg.height // self.pipe.vae_scale_factor_spatial,
            seg.width // self.pipe.vae_scale_factor_spatial,
        )
        channels = self.pipe.transformer.config.in_channels
        noise = torch.randn(
            (1, channels, new, h, w), generator=torch.Generator("cpu").manual_seed(seed)
        )
        latents_in = torch.cat([torch.zeros(1, channels, taken, h, w), noise], 2)
        # The shot's first picture: its first chunk, as context (the noise drawn for it unused).
        pictured = {} if picture is None else {"video": picture}
        out = self.pipe(
            **pictured,
            prompt_embeds=embeds["prompt_embeds"],
            negative_prompt_embeds=embeds.get("negative_prompt_embeds")
            if self.guidance > 1
            else None,
            video_latents=None
            if context is None
            else context.permute(0, 2, 1, 3, 4).to(self.device),
            latents=latents_in.to(self.device),
            chunk_partition=context_parts + parts,
            num_frames=4 * (taken + new - 1) + 1,
            height=seg.height,
            width=seg.width,
            num_inference_steps=self.steps,
            guidance_scale=self.guidance,
            output_type="latent",
            callback_on_step_end=_stop_between_steps,
        ).frames
        latents = out[:, :, taken:]  # the output starts with its context (or the picture)
        history_parts = [
            int(p) for p in state.get("parts", torch.tensor([], dtype=torch.int64)).tolist()
        ]
        all_parts = ([] if seg.starts_shot else history_parts) + parts
        return latents, {"parts": torch.tensor(_suffix(all_parts, self.window), dtype=torch.int64)}

    def _picture(self, seg: SegmentSpec) -> Any | None:
        """The shot's first picture as AnyFlow-FAR's image-to-video takes it: a 1-frame
        `video` (B, T, C, H, W in 0..1), encoded (the posterior mean) into the first chunk of
        the partition, a chunk of 1 latent frame in the released checkpoints: the segment's
        first latent frame is the picture's, and the rest continue from it."""
        if seg.image is None or seg.image_role != "first-frame":
            return None
        import torch

        if self.partition[0] != 1:
            raise PermanentError(
                f"{self.name}: {self.model.path} is tuned for a first chunk of "
                f"{self.partition[0]} latent frames; a first-frame picture fills one"
            )
        pixels = torch.from_numpy(np.array(seg.image, np.uint8)).permute(2, 0, 1)  # a copy
        return (pixels.float() / 255)[None, None]  # the pipeline moves it to its device


def _suffix(parts: list[int], limit: int) -> list[int]:
    """The last whole chunks whose latent frames sum to at most `limit`."""
    kept: list[int] = []
    for part in reversed(parts):
        if sum(kept) + part > limit:
            break
        kept.insert(0, part)
    return kept


def _context(state: dict[str, Any], room: int) -> tuple[Any, list[int]]:
    """The previous segments' last whole chunks that fit `room` latent frames, with the
    partition they were made in (re-chunked context changes the result)."""
    parts = [int(p) for p in state["parts"].tolist()]
    kept = _suffix(parts, room)
    latents = state["latents"]
    return latents[:, :, latents.shape[2] - sum(kept) :], kept


LATENT_GENERATORS: dict[str, type[LatentGenerator]] = {
    "helios": Helios,
    "anyflow-far": AnyFlowFar,
}
