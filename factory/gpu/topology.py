"""How a node's GPUs are wired: `nvidia-smi topo -m` parsed into NVLink-connected groups,
NUMA and CPU affinity, and the placement of multi-GPU work on GPUs that share NVLinks.

`nvidia-smi topo -m` prints a tab-separated matrix: a header of device columns (GPU0…,
NIC0… or mlx5_0…, then "CPU Affinity", "NUMA Affinity", "GPU NUMA ID" on newer drivers),
one row per GPU with a link code per column (`X` self, `NV#` a bond of # NVLinks,
`PIX`/`PXB`/`PHB`/`NODE`/`SYS` PCIe paths of growing distance) and the affinities, then NIC
rows, then legends. GPU numbers are nvidia-smi's (PCI bus order): workers pinned from this
topology must set CUDA_DEVICE_ORDER=PCI_BUS_ID for CUDA to number them the same way.
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # some drivers underline the header on a terminal
_NVLINK = re.compile(r"^NV(\d+)$")
_GPU = re.compile(r"^GPU(\d+)$")
# Multi-word header names, joined so that the header splits on whitespace like the rows do
# (tickets and chats often turn the tabs into spaces).
_HEADER_NAMES = {
    "CPU Affinity": "CPU_Affinity",
    "NUMA Affinity": "NUMA_Affinity",
    "GPU NUMA ID": "GPU_NUMA_ID",
}
_AFFINITY_COLUMNS = ("CPU_Affinity", "NUMA_Affinity", "GPU_NUMA_ID")


class TopologyError(ValueError):
    """The text is not an `nvidia-smi topo -m` matrix we can read (says which line and why)."""


@dataclass(frozen=True)
class GpuInfo:
    """One line of `nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,memory.total`."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str = ""
    memory_mib: int = 0


@dataclass(frozen=True)
class Gpu:
    index: int
    links: dict[str, str]  # column name (GPU1, NIC0, …) -> link code as printed
    cpu_affinity: str = ""  # as printed, e.g. "0-31,64-95"; "" when not reported
    numa: int | None = None
    info: GpuInfo | None = None

    @property
    def cpus(self) -> list[int]:
        return parse_cpu_list(self.cpu_affinity)

    def nvlinks_to(self, other: int) -> int:
        """Bonded NVLinks to another GPU: 0 when their path is PCIe only."""
        match = _NVLINK.match(self.links.get(f"GPU{other}", ""))
        return int(match.group(1)) if match else 0

    @property
    def nearest_nics(self) -> list[str]:
        """The NICs behind at most PCIe switches from this GPU (PIX/PXB), for RDMA."""
        return [
            n
            for n, code in self.links.items()
            if not n.startswith("GPU") and code in ("PIX", "PXB")
        ]


@dataclass(frozen=True)
class Topology:
    gpus: tuple[Gpu, ...]
    nic_names: dict[str, str] = field(default_factory=dict)  # NIC0 -> mlx5_0 (NIC legend)

    def gpu(self, index: int) -> Gpu:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        raise KeyError(f"GPU{index} is not in this topology")

    @property
    def indexes(self) -> list[int]:
        return [g.index for g in self.gpus]

    def nvlinks(self, a: int, b: int) -> int:
        # Both directions are printed; a bond counts only where both rows agree it exists.
        return min(self.gpu(a).nvlinks_to(b), self.gpu(b).nvlinks_to(a))

    def groups(self) -> list[list[int]]:
        """NVLink-connected groups: GPUs that reach each other over NVLink, directly or
        through other GPUs of the group (NVSwitch systems: one group of all GPUs)."""
        unseen, found = set(self.indexes), []
        while unseen:
            start = min(unseen)
            group, frontier = {start}, [start]
            while frontier:
                here = frontier.pop()
                for other in list(unseen - group):
                    if self.nvlinks(here, other):
                        group.add(other)
                        frontier.append(other)
            unseen -= group
            found.append(sorted(group))
        return sorted(found, key=lambda g: (-len(g), g))

    def group_of(self, index: int) -> int:
        """The position of the GPU's group in `groups()`."""
        return next(n for n, group in enumerate(self.groups()) if index in group)

    def place(self, count: int, free: Iterable[int] | None = None) -> list[int] | None:
        """`count` GPUs every two of which share NVLinks, from `free` (all when None): the
        set with the widest narrowest link, then on fewest NUMA nodes, then lowest numbers.
        None when no such set exists."""
        if count < 1:
            raise ValueError("count must be at least 1")
        available = sorted(set(self.indexes if free is None else free) & set(self.indexes))
        best: tuple[tuple[int, int, list[int]], list[int]] | None = None
        for group in self.groups():
            candidates = [g for g in group if g in available]
            for chosen in itertools.combinations(candidates, count):
                narrowest = self.narrowest(chosen)
                if count > 1 and narrowest == 0:
                    continue
                key = (-narrowest, self.numa_nodes(chosen), list(chosen))
                if best is None or key < best[0]:
                    best = (key, list(chosen))
        return best[1] if best else None

    def narrowest(self, chosen: Iterable[int]) -> int:
        """The fewest NVLinks between any two of these GPUs (0: some pair has none, or
        fewer than two GPUs)."""
        widths = [self.nvlinks(a, b) for a, b in itertools.combinations(chosen, 2)]
        return min(widths) if widths else 0

    def numa_nodes(self, chosen: Iterable[int]) -> int:
        return len({self.gpu(g).numa for g in chosen})

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpus": [
                {
                    "index": g.index,
                    "links": g.links,
                    "cpu_affinity": g.cpu_affinity,
                    "numa": g.numa,
                    "info": g.info.__dict__ if g.info else None,
                }
                for g in self.gpus
            ],
            "nic_names": self.nic_names,
            "groups": self.groups(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Topology:
        gpus = tuple(
            Gpu(
                g["index"],
                dict(g["links"]),
                g.get("cpu_affinity", ""),
                g.get("numa"),
                GpuInfo(**g["info"]) if g.get("info") else None,
            )
            for g in data["gpus"]
        )
        return cls(gpus, dict(data.get("nic_names", {})))

    def with_info(self, infos: Iterable[GpuInfo]) -> Topology:
        by_index = {i.index: i for i in infos}
        return Topology(
            tuple(
                Gpu(g.index, g.links, g.cpu_affinity, g.numa, by_index.get(g.index))
                for g in self.gpus
            ),
            self.nic_names,
        )


def parse_topology(text: str) -> Topology:
    """Parse `nvidia-smi topo -m` output (tabs or spaces, with or without legends)."""
    lines = [_ANSI.sub("", line).rstrip() for line in text.splitlines()]
    header_at = next((n for n, line in enumerate(lines) if "GPU0" in line.split()), None)
    if header_at is None:
        raise TopologyError("no header line with GPU0: is this `nvidia-smi topo -m` output?")
    header = lines[header_at]
    for words, joined in _HEADER_NAMES.items():
        header = header.replace(words, joined)
    columns = header.split()
    devices = [c for c in columns if c not in _AFFINITY_COLUMNS]
    extras = [c for c in columns if c in _AFFINITY_COLUMNS]
    gpu_columns = [c for c in devices if _GPU.match(c)]

    gpus: list[Gpu] = []
    for number, line in enumerate(lines[header_at + 1 :], start=header_at + 2):
        cells = line.split()
        if not cells:
            if gpus:
                break  # the blank line before the legend
            continue
        if cells[0] == "Legend:":
            break
        if not _GPU.match(cells[0]):
            continue  # NIC rows
        gpus.append(_gpu_row(cells, devices, extras, number))
    if not gpus:
        raise TopologyError(f"line {header_at + 1}: a header but no GPU rows below it")
    found = [f"GPU{g.index}" for g in gpus]
    if found != gpu_columns:
        raise TopologyError(
            f"the rows ({', '.join(found)}) do not match the header's GPU "
            f"columns ({', '.join(gpu_columns)})"
        )
    for gpu in gpus:
        for other in gpus:
            if gpu.index != other.index and bool(gpu.nvlinks_to(other.index)) != bool(
                other.nvlinks_to(gpu.index)
            ):
                raise TopologyError(
                    f"GPU{gpu.index} and GPU{other.index} disagree on their "
                    "NVLink (the matrix is not symmetric)"
                )
    return Topology(tuple(gpus), _nic_legend(lines))


def _gpu_row(cells: list[str], devices: list[str], extras: list[str], number: int) -> Gpu:
    name, values = cells[0], cells[1:]
    if len(values) < len(devices):
        raise TopologyError(
            f"line {number}: {name} has {len(values)} cells for {len(devices)} device columns"
        )
    links = dict(zip(devices, values[: len(devices)], strict=True))
    if links.get(name) != "X":
        raise TopologyError(
            f"line {number}: {name} should be X against itself, not {links.get(name)!r}"
        )
    del links[name]
    affinity = dict(zip(extras, values[len(devices) :], strict=False))
    cpus = affinity.get("CPU_Affinity", "")
    if cpus == "N/A":
        cpus = ""
    elif cpus:
        try:
            parse_cpu_list(cpus)
        except ValueError as error:
            raise TopologyError(f"line {number}: {name}: CPU affinity {cpus!r}: {error}") from None
    numa_text = affinity.get("NUMA_Affinity", "")
    numa = int(numa_text) if numa_text.isdigit() else None
    return Gpu(int(name[3:]), links, cpus, numa)


def _nic_legend(lines: list[str]) -> dict[str, str]:
    names: dict[str, str] = {}
    for line in lines:
        match = re.match(r"^\s*(NIC\d+):\s*(\S+)\s*$", line)
        if match:
            names[match.group(1)] = match.group(2)
    return names


def parse_cpu_list(text: str) -> list[int]:
    """ "0-3,8,10-11" -> [0, 1, 2, 3, 8, 10, 11] (Linux cpulist format)."""
    cpus: list[int] = []
    for part in text.split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"{part!r} is not a CPU number or range")
        first, last = int(low), int(high or low)
        if last < first:
            raise ValueError(f"{part!r} is a descending range")
        cpus.extend(range(first, last + 1))
    return cpus


def parse_gpu_list(text: str) -> list[GpuInfo]:
    """Parse `nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,memory.total
    --format=csv,noheader,nounits`."""
    infos = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 3 or not cells[0].isdigit():
            raise TopologyError(f"GPU list line {number}: expected index, uuid, name, …: {line!r}")
        memory = cells[4] if len(cells) > 4 and cells[4].isdigit() else "0"
        infos.append(
            GpuInfo(
                int(cells[0]), cells[1], cells[2], cells[3] if len(cells) > 3 else "", int(memory)
            )
        )
    return infos


QUERY_GPUS = [
    "--query-gpu=index,uuid,name,pci.bus_id,memory.total",
    "--format=csv,noheader,nounits",
]


def probe(nvidia_smi: str = "nvidia-smi", timeout: float = 30) -> Topology:
    """This node's topology, from the driver's own tool (no CUDA context is created)."""
    executable = shutil.which(nvidia_smi)
    if executable is None:
        raise TopologyError(f"{nvidia_smi} not found: no NVIDIA driver on this node?")

    def run(*args: str) -> str:
        done = subprocess.run(
            [executable, *args], capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip().splitlines()
            raise TopologyError(
                f"`{nvidia_smi} {' '.join(args)}` exited {done.returncode}: "
                f"{detail[0] if detail else 'no output'}"
            )
        return done.stdout

    return parse_topology(run("topo", "-m")).with_info(parse_gpu_list(run(*QUERY_GPUS)))
