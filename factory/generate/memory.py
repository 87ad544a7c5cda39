"""GPU memory governance for the diffusers backends: what the settings switch on (VAE tiling,
group offload, layerwise casting), the allocator configuration, and the per-segment
measurement (peak allocated, peak reserved, fragmentation) recorded on the job."""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any

# Expandable segments let the caching allocator grow blocks instead of stranding them: the
# long-video workload (same shapes segment after segment, one big VAE decode) fragments less.
DEFAULT_ALLOC_CONF = "expandable_segments:True"
GROUP_OFFLOAD_MODES = ("off", "block", "leaf")
LAYERWISE_CASTING_MODES = ("off", "fp8")


def configure_allocator() -> None:
    """Before torch touches CUDA: the factory's allocator default, unless the operator set one."""
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", DEFAULT_ALLOC_CONF)


AUTO_OFFLOAD_BELOW = 40 << 30


@dataclass(frozen=True)
class MemoryPolicy:
    vae_tiling: bool = False
    # auto (block on a card under 40 GiB, else off) | off | block (one transformer block on
    # the GPU at a time) | leaf
    group_offload: str = "auto"
    layerwise_casting: str = "off"  # off | fp8 (weights stored in float8, computed in bf16)

    def apply(self, pipe: Any, device: str, dtype: Any) -> None:
        """Enable what the policy asks for on a freshly loaded pipeline (before `.to(device)`
        of the offloaded modules, which group offload then owns)."""
        import torch

        if self.layerwise_casting == "fp8":
            pipe.transformer.enable_layerwise_casting(
                storage_dtype=torch.float8_e4m3fn, compute_dtype=dtype
            )
        offload = self.offload_on(device)
        if offload != "off":
            pipe.transformer.enable_group_offload(
                onload_device=torch.device(device),
                offload_device=torch.device("cpu"),
                offload_type="block_level" if offload == "block" else "leaf_level",
                **({"num_blocks_per_group": 1} if offload == "block" else {}),
            )
            pipe.vae.to(device)
        else:
            pipe.to(device)
        if self.vae_tiling:
            pipe.vae.enable_tiling()

    def offload_on(self, device: str) -> str:
        """The group offload `auto` means on this device: block level on a CUDA card under
        AUTO_OFFLOAD_BELOW (a 14B transformer's bf16 weights alone are 26.7 GiB), else off."""
        if self.group_offload != "auto":
            return self.group_offload
        if not device.startswith("cuda"):
            return "off"
        import torch

        total = torch.cuda.get_device_properties(torch.device(device)).total_memory
        return "block" if total < AUTO_OFFLOAD_BELOW else "off"

    def describe(self, device: str = "cpu") -> dict[str, Any]:
        return {
            "vae_tiling": self.vae_tiling,
            "group_offload": self.offload_on(device),
            "layerwise_casting": self.layerwise_casting,
        }


@dataclass
class MemoryReading:
    device: str
    peak_allocated: int | None = None  # bytes; CUDA only
    peak_reserved: int | None = None
    fragmentation: float | None = None  # 1 - allocated/reserved at the peak
    peak_rss: int | None = None  # bytes, the worker process (every device)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The readings, then whatever a backend added (`extra`) beside them."""
        readings = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        return readings | self.extra


@contextmanager
def measure(device: str) -> Iterator[MemoryReading]:
    """Peak GPU memory over the block (reset at its start); the process's peak RSS as well."""
    reading = MemoryReading(device=device)
    cuda = device.startswith("cuda")
    if cuda:
        import torch

        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        reading.extra["gpu"] = torch.cuda.get_device_name(device)
    try:
        yield reading
    finally:
        if cuda:
            import torch

            torch.cuda.synchronize(device)
            reading.peak_allocated = int(torch.cuda.max_memory_allocated(device))
            reading.peak_reserved = int(torch.cuda.max_memory_reserved(device))
            if reading.peak_reserved:
                reading.fragmentation = round(
                    1.0 - reading.peak_allocated / reading.peak_reserved, 4
                )
        reading.peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def is_out_of_memory(error: BaseException) -> bool:
    import torch

    return isinstance(error, torch.OutOfMemoryError)


def release_cached(device: str) -> None:
    """After an out-of-memory error: drop the allocator's cached blocks before the retry."""
    import gc

    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()
