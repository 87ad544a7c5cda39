"""How full a GPU's memory is, read without creating a CUDA context (a worker's prefork
parent must never initialise CUDA): NVML, or a file another program keeps up to date (tests,
external monitors). `FACTORY_GPU_MEMORY_SOURCE`: `nvml` (default), `file:/path`, `none`."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

log = logging.getLogger("factory.generate.gpu_memory")  # its name before issue 36


@dataclass(frozen=True)
class MemoryReading:
    used: int
    total: int

    @property
    def fraction(self) -> float:
        return self.used / self.total if self.total else 0.0


class MemorySource(Protocol):
    name: str

    def read(self) -> MemoryReading | None: ...  # None: no reading available


class NvmlMemory:
    """NVML's view of one GPU (by index, as `nvidia-smi` numbers them)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.name = f"nvml:{index}"
        self._handle = None

    def read(self) -> MemoryReading | None:
        try:
            import pynvml

            if self._handle is None:
                pynvml.nvmlInit()
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            info = pynvml.nvmlDeviceGetMemoryInfo(self._handle)
            return MemoryReading(int(info.used), int(info.total))
        except Exception as error:  # no driver, no GPU, no package: no reading
            log.debug("gpu_memory.unavailable", extra={"error": str(error)})
            return None


class FileMemory:
    """A file holding `USED TOTAL` in bytes, or a fraction from 0 to 1."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = f"file:{path}"

    def read(self) -> MemoryReading | None:
        try:
            parts = self.path.read_text().split()
            if len(parts) == 1:
                return MemoryReading(round(float(parts[0]) * 1_000_000), 1_000_000)
            return MemoryReading(int(parts[0]), int(parts[1]))
        except (OSError, ValueError, IndexError):
            return None


class NoMemory:
    name = "none"

    def read(self) -> MemoryReading | None:
        return None


def open_memory_source(spec: str, gpu: int | None) -> MemorySource:
    if spec.startswith("file:"):
        return FileMemory(Path(spec[len("file:") :]))
    if spec == "nvml" and gpu is not None:
        return NvmlMemory(gpu)
    return NoMemory()
