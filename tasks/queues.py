"""Queue names. `gpu.<host>.<n>` is one GPU's own queue (a job's segments stay on it while its
worker lives), `gpu` is the shared fallback every GPU worker also consumes, `cpu` takes the
encode → mux → qc → deliver chain and chunk encodes."""

from __future__ import annotations

import socket

GPU_SHARED = "gpu"
CPU = "cpu"
ALIVE_PREFIX = "factory:queue-alive:"  # a GPU worker's own queue is consumed while this key lives


def gpu_queue(gpu: int, host: str | None = None) -> str:
    return f"gpu.{host or socket.gethostname()}.{gpu}"
