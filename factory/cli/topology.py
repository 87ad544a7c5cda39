"""GPU topology on the command line: `factory worker --gpus auto` (a worker per GPU, the
node's topology recorded) and `factory gpu topology` (what was recorded, or a node's
`nvidia-smi topo -m` read now, and where multi-GPU work would be placed)."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import typer
from rich.console import Group
from rich.table import Table
from rich.text import Text

from factory.cli import common
from factory.cli.common import check_health_port, err, out
from factory.cli.gpu import gpu_app
from factory.config import Settings
from factory.errors import BadInput
from factory.gpu.pool import Child, GpuPool
from factory.gpu.registry import GpuNode, GpuRegistry, Placement, place_on
from factory.gpu.topology import Topology, TopologyError, parse_topology, probe
from factory.infra import logs
from factory.wiring import Factory


def register() -> None:
    gpu_app.command("topology")(topology)


def run_gpu_pool(
    settings: Settings, gpus: str, options: list[str], health_port: int | None, pin_cpus: bool
) -> int:
    """Probe, record, then run one `factory worker --gpu N` per GPU until told to stop."""
    from tasks.queues import gpu_queue  # the CLI is the edge where factory/ meets tasks/

    selected, found = _select(settings, gpus)
    for position in range(len(selected) if health_port else 0):
        check_health_port(settings.health.host, health_port + position)
    host = socket.gethostname()
    queues = {gpu: gpu_queue(gpu, host) for gpu in selected}
    if found is not None:
        factory = Factory.open(settings)
        try:
            GpuRegistry(factory.database).record(host, found, queues)
        finally:
            factory.close()
        out.print(_node_table(GpuNode(host, found, queues)))
    children = []
    for position, gpu in enumerate(selected):
        argv = [sys.executable, "-m", "factory", "worker", "--gpu", str(gpu), *options]
        if health_port is not None:
            argv += ["--health-port", str(health_port + position if health_port else 0)]
        if pin_cpus and found is not None and found.gpu(gpu).cpu_affinity:
            argv += ["--cpus", found.gpu(gpu).cpu_affinity]
        children.append(Child(gpu, argv))
    logs.configure(settings.log_format)
    err.print(f"starting {len(children)} GPU workers on {host}: GPUs {_list(selected)}")
    return GpuPool(children).run()


def _select(settings: Settings, gpus: str) -> tuple[list[int], Topology | None]:
    if gpus == "auto":
        try:
            found = probe(settings.nvidia_smi)
        except TopologyError as error:
            raise BadInput(
                f"{error}; name the GPUs (--gpus 0,1) or use --gpu N", field="--gpus"
            ) from None
        return found.indexes, found
    try:
        wanted = sorted({int(part) for part in gpus.split(",") if part.strip()})
    except ValueError:
        wanted = []
    if not wanted or min(wanted) < 0:
        raise BadInput(f"{gpus!r}: give auto or GPU numbers such as 0,1,3", field="--gpus")
    try:
        found = probe(settings.nvidia_smi)
    except TopologyError as error:
        err.print(f"topology not recorded ({error}); starting GPUs {_list(wanted)} anyway")
        return wanted, None
    missing = sorted(set(wanted) - set(found.indexes))
    if missing:
        raise BadInput(f"no GPU {_list(missing)} on this node (it has {_list(found.indexes)})",
                       field="--gpus")  # fmt: skip
    return wanted, found


def topology(
    source: Path | None = typer.Option(
        None, "--from", help="Read a saved `nvidia-smi topo -m` output (- for stdin)."
    ),
    probe_here: bool = typer.Option(False, "--probe", help="Run nvidia-smi on this node now."),
    place: int | None = typer.Option(
        None, "--place", min=1, help="Where K GPUs, pairwise NVLinked, would be placed."
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """The GPU topology: what `factory worker --gpus auto` recorded on each node (default),
    a saved output (--from) or this node now (--probe): NVLink groups, NUMA, CPUs, queues."""
    if source is not None and probe_here:
        raise BadInput("give at most one of --from and --probe", field="gpu topology")
    settings = common.settings()
    if source is not None or probe_here:
        try:
            if source is None:
                found = probe(settings.nvidia_smi)
            else:
                text = sys.stdin.read() if str(source) == "-" else _read(source)
                found = parse_topology(text)
        except TopologyError as error:
            raise BadInput(str(error), field=str(source or "nvidia-smi")) from None
        nodes = [GpuNode(socket.gethostname() if probe_here else str(source), found, {})]
    else:
        factory = Factory.open(settings)
        try:
            nodes = GpuRegistry(factory.database).nodes()
        finally:
            factory.close()
        if not nodes:
            err.print(
                "no topology recorded yet: start GPU workers with `factory worker --gpus auto`"
            )
    placement = place_on(nodes, place) if place else None
    if as_json:
        data = {
            "nodes": [
                {"host": n.host, "queues": n.queues, **n.topology.to_dict(),
                 "recorded_at": n.recorded_at.isoformat() if n.recorded_at else None}
                for n in nodes
            ]
        }  # fmt: skip
        if place:
            data["placement"] = placement.__dict__ if placement else None
        print(json.dumps(data, indent=2))
    else:
        for node in nodes:
            out.print(_node_table(node))
        if place:
            out.print(_placement_line(place, placement))
    if place and placement is None:
        raise typer.Exit(3)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as error:
        raise BadInput(f"cannot read it: {error.strerror}", field=str(path)) from None


def _placement_line(count: int, placement: Placement | None) -> str:
    if placement is None:
        return f"no node has {count} GPUs that are pairwise NVLinked"
    links = f"narrowest link NV{placement.nvlinks}" if placement.nvlinks else "one GPU"
    queues = (
        f" (queues {', '.join(q for q in placement.queues if q)})" if any(placement.queues) else ""
    )
    return f"{count} GPUs: {placement.host} GPUs {_list(placement.gpus)}, {links}{queues}"


def _node_table(node: GpuNode) -> Group:
    topo = node.topology
    groups = topo.groups()
    when = f", recorded {node.recorded_at:%Y-%m-%d %H:%M} UTC" if node.recorded_at else ""
    title = f"{node.host}: {len(topo.gpus)} GPUs, NVLink groups " + " ".join(
        "{" + _list(g) + "}" for g in groups
    )
    table = Table()
    for column in ("GPU", "model", "queue", "group", "NVLinks in group", "NUMA", "CPUs", "NICs"):
        table.add_column(column)
    for gpu in topo.gpus:
        group = groups[topo.group_of(gpu.index)]
        peers = [f"{p}:NV{topo.nvlinks(gpu.index, p)}" for p in group if p != gpu.index
                 and topo.nvlinks(gpu.index, p)]  # fmt: skip
        table.add_row(
            str(gpu.index),
            gpu.info.name if gpu.info else "-",
            node.queues.get(gpu.index, "-"),
            str(topo.group_of(gpu.index)),
            " ".join(peers) or "-",
            "-" if gpu.numa is None else str(gpu.numa),
            gpu.cpu_affinity or "-",
            " ".join(topo.nic_names.get(n, n) for n in gpu.nearest_nics) or "-",
        )
    return Group(Text(title + when), table)


def _list(numbers: list[int]) -> str:
    return ",".join(map(str, numbers))
