"""Choosing the attention backend once per worker: `_flash_3` (flash-attn 3 on Hopper), then
`flash` (flash-attn 2), then `native` (torch SDPA), by what is installed and what the call
needs; the reason is logged and recorded on the job's segment events."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

BACKENDS = ("_flash_3", "flash", "native")


@dataclass(frozen=True)
class Capabilities:
    cuda: bool
    compute_capability: tuple[int, int] | None
    flash_attn_2: bool
    flash_attn_3: bool

    @classmethod
    def probe(cls, device: str) -> Capabilities:
        cuda = device.startswith("cuda")
        capability = None
        if cuda:
            import torch

            capability = torch.cuda.get_device_capability(torch.device(device))
        return cls(cuda, capability, _installed("flash_attn"), _installed("flash_attn_interface"))


def choose(
    caps: Capabilities, *, dense_mask: bool = False, override: str | None = None
) -> tuple[str, str]:
    """(backend, reason)."""
    if override:
        if override not in BACKENDS:
            raise ValueError(f"attention backend {override!r} is not one of {', '.join(BACKENDS)}")
        return override, "chosen by FACTORY_ATTENTION_BACKEND"
    if not caps.cuda:
        return "native", "no CUDA device: torch SDPA"
    if dense_mask:
        return "native", "the call needs a dense attention mask, which the flash kernels reject"
    if caps.flash_attn_3 and caps.compute_capability and caps.compute_capability >= (9, 0):
        return "_flash_3", "flash-attn 3 on a Hopper-class GPU"
    if caps.flash_attn_2:
        return "flash", "flash-attn 2 installed"
    return "native", "flash-attn is not installed (pip install '.[gpu]'): torch SDPA"


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None
