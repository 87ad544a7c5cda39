"""What a worker process holds: the database handle, the stage context with its warm
generators, and the tail of the last segment it made. Built after the fork
(`worker_process_init`), never in the prefork parent: no CUDA, no database connection
crosses a fork."""

from __future__ import annotations

import importlib
import os
import socket
from dataclasses import dataclass, field

import redis

from factory.config import Settings
from factory.db.state import JobStateMachine
from factory.generate.memory import configure_allocator
from factory.pipeline.claims import Claims, open_claims
from factory.pipeline.context import StageContext
from factory.pipeline.generate import WarmTail
from factory.wiring import Factory


@dataclass
class Runtime:
    settings: Settings
    factory: Factory
    ctx: StageContext
    worker: str
    own_queue: str | None  # this GPU worker's queue, if it is one
    warm: WarmTail | None = field(default=None)
    _broker: redis.Redis | None = field(default=None)
    _claims: Claims | None = field(default=None)

    @property
    def broker(self) -> redis.Redis:
        """One Redis client per process for looking into the broker (queues, alive keys)."""
        if self._broker is None:
            self._broker = redis.Redis.from_url(
                self.settings.broker_url or "redis://", socket_timeout=10, socket_connect_timeout=10
            )
        return self._broker

    @property
    def claims(self) -> Claims:
        """Claims on chunks being encoded (factory/pipeline/claims.py): in Redis, shared by
        every worker (FACTORY_REDIS_URL, else the broker's Redis)."""
        if self._claims is None:
            self._claims = open_claims(self.settings.redis_url, self.settings.broker_url,
                                       ttl=self.settings.lease_seconds)  # fmt: skip
        return self._claims

    @property
    def machine(self) -> JobStateMachine:
        return self.factory.jobs


_runtime: Runtime | None = None


def runtime() -> Runtime:
    global _runtime
    if _runtime is None or _runtime.worker.split("/")[-1] != f"pid-{os.getpid()}":
        # The spec parser every job's `video` needs (its pydantic models take about half a
        # second to build): loaded with the process, not inside the first job it takes.
        importlib.import_module("factory.manifest")
        settings = Settings.from_env()
        factory = Factory.open(settings)
        ctx = StageContext.from_settings(
            settings, factory.jobs, factory.database, device=_device(settings.worker_allow_cpu)
        )
        own = settings.gpu_queue
        _runtime = Runtime(
            settings,
            factory,
            ctx,
            worker=f"{socket.gethostname()}/{own or 'cpu'}/pid-{os.getpid()}",
            own_queue=own,
        )
    return _runtime


def _device(allow_cpu: bool) -> str:
    """`cuda` for a GPU worker (checked in the child, after the fork). `factory worker --gpu N`
    gave it a GPU nvidia-smi lists, or none (empty: the CPU, allowed on purpose); a GPU that
    CUDA cannot use (a CPU build of torch, a driver too old) is not run on the CPU silently."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not visible:
        return "cpu"
    configure_allocator()
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if allow_cpu:
        return "cpu"
    raise RuntimeError(
        f"CUDA_VISIBLE_DEVICES={visible} but torch {torch.__version__} (CUDA "
        f"{torch.version.cuda or 'none: a CPU build'}) sees no usable GPU; install the CUDA "
        "build for this driver, or set FACTORY_WORKER_ALLOW_CPU=1 to run on the CPU on purpose"
    )
