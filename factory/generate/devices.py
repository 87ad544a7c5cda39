"""Which GPU a `factory worker --gpu N` process uses, decided before it starts (no CUDA).

`--gpu N` is an index into the GPUs *this process* can see. Where CUDA_VISIBLE_DEVICES is
already set (a systemd unit, a scheduler, a container runtime that sets it), N indexes that
list; otherwise N is nvidia-smi's index here, which inside a container is the container's
own view (one card reserved for it is GPU 0, whatever its number on the host). A GPU that is
not visible is refused with what is; a node with no GPU at all is refused too, unless the
worker was told it may run the GPU stages on the CPU (tests, CPU-only trials)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from factory.gpu.topology import QUERY_GPUS, TopologyError, parse_gpu_list

# CUDA_VISIBLE_DEVICES values that hide every GPU.
_HIDDEN = {"", "-1", "none", "void", "nodevfiles"}


class GpuNotUsable(Exception):
    """The worker cannot have the GPU it was asked for; the message says what it can see."""


@dataclass(frozen=True)
class DeviceChoice:
    cuda_visible_devices: str  # for the worker's processes; "" : no GPU, the stages on CPU
    note: str | None = None  # said when the worker runs on the CPU

    @property
    def on_cpu(self) -> bool:
        return self.cuda_visible_devices == ""


def visible_list(inherited: str) -> list[str]:
    """The entries of a CUDA_VISIBLE_DEVICES value (indices or GPU-/MIG- UUIDs)."""
    entries = [e.strip() for e in inherited.split(",")]
    if not entries or entries[0].lower() in _HIDDEN:
        return []
    return entries


def choose_device(
    requested: int, inherited: str | None, listed: int, listed_how: str, allow_cpu: bool
) -> DeviceChoice:
    """CUDA_VISIBLE_DEVICES for the worker asked for GPU `requested`.

    inherited: CUDA_VISIBLE_DEVICES as the worker found it (None: unset); listed: how many
    GPUs nvidia-smi lists here, and listed_how says so in words (or why none)."""
    if inherited is not None:
        visible = visible_list(inherited)
        where = f"CUDA_VISIBLE_DEVICES={inherited!r} was set before the worker started"
        if visible:
            last = f" to --gpu {len(visible) - 1}" if len(visible) > 1 else ""
            where += f": it sees {len(visible)} GPU(s), --gpu 0{last}"
    else:
        visible = [str(i) for i in range(listed)]
        where = listed_how
    if requested < len(visible):
        return DeviceChoice(visible[requested])
    if allow_cpu:
        return DeviceChoice("", f"--gpu {requested}: no such GPU here ({where}); running the "
                                "GPU stages on the CPU, as allowed (--allow-cpu)")  # fmt: skip
    if not visible:
        raise GpuNotUsable(
            f"no GPU is visible here ({where}); a GPU worker would run on "
            "the CPU. Give --allow-cpu (or FACTORY_WORKER_ALLOW_CPU=1) to run it on the CPU "
            "on purpose"
        )
    raise GpuNotUsable(
        f"GPU {requested} is not visible here ({where}). The index is this "
        "process's view: inside a container that is given one card, that card is --gpu 0"
    )


def list_gpus(nvidia_smi: str = "nvidia-smi", timeout: float = 30) -> tuple[int, str]:
    """How many GPUs the driver's tool lists here (it ignores CUDA_VISIBLE_DEVICES, and
    inside a container sees only the container's cards), and that in words."""
    executable = shutil.which(nvidia_smi)
    if executable is None:
        return 0, f"{nvidia_smi} not found: no NVIDIA driver here"
    try:
        done = subprocess.run(
            [executable, *QUERY_GPUS], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return 0, f"{nvidia_smi} failed: {error}"
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        return 0, f"{nvidia_smi} exited {done.returncode}: {detail[0] if detail else 'no output'}"
    try:
        infos = parse_gpu_list(done.stdout)
    except TopologyError as error:
        return 0, f"{nvidia_smi}: {error}"
    if not infos:
        return 0, f"{nvidia_smi} lists no GPU"
    numbers = ",".join(str(i) for i in range(len(infos)))
    return len(infos), f"{nvidia_smi} lists {len(infos)} GPU(s) here: {numbers}"
