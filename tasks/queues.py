"""Queue names. `gpu.<host>.<n>` is one GPU's own queue (a job's segments stay on it while its
worker lives), `gpu` is the shared fallback every GPU worker also consumes, `cpu` takes the
encode → mux → qc → deliver chain and chunk encodes, `control` the sweeps."""

from __future__ import annotations

import socket

GPU_SHARED = "gpu"
CPU = "cpu"
CONTROL = "control"  # the sweeper: consumed by `factory beat` itself, never behind media work
ALIVE_PREFIX = "factory:queue-alive:"  # a GPU worker's own queue is consumed while this key lives


def gpu_queue(gpu: int, host: str | None = None) -> str:
    return f"gpu.{host or socket.gethostname()}.{gpu}"
