"""Where each node's GPU topology is recorded (table gpu_nodes) and where multi-GPU work is
placed from it: on GPUs of one node that share NVLinks, widest links first."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, insert, select

from factory.db.models import gpu_nodes, utcnow
from factory.db.session import Database
from factory.gpu.topology import Topology


@dataclass(frozen=True)
class GpuNode:
    host: str
    topology: Topology
    queues: dict[int, str]  # GPU number (nvidia-smi's) -> its worker's queue
    recorded_at: datetime | None = None  # None: read now, not recorded


@dataclass(frozen=True)
class Placement:
    host: str
    gpus: list[int]
    queues: list[str]
    nvlinks: int  # the narrowest link between two of them (0 for one GPU)


class GpuRegistry:
    def __init__(self, database: Database) -> None:
        self.database = database

    def record(self, host: str, topology: Topology, queues: dict[int, str]) -> None:
        """Replace what is known about this node (a node re-records at every start)."""
        unknown = set(queues) - set(topology.indexes)
        if unknown:
            raise ValueError(f"queues for GPUs {sorted(unknown)} not in the topology of {host}")
        with self.database.transaction() as conn:
            conn.execute(delete(gpu_nodes).where(gpu_nodes.c.host == host))
            conn.execute(
                insert(gpu_nodes).values(
                    host=host,
                    topology=topology.to_dict(),
                    queues={str(k): v for k, v in sorted(queues.items())},
                    recorded_at=utcnow(),
                )
            )

    def forget(self, host: str) -> bool:
        with self.database.transaction() as conn:
            return conn.execute(delete(gpu_nodes).where(gpu_nodes.c.host == host)).rowcount > 0

    def nodes(self) -> list[GpuNode]:
        with self.database.connect() as conn:
            rows = conn.execute(select(gpu_nodes).order_by(gpu_nodes.c.host)).all()
        return [
            GpuNode(
                row.host,
                Topology.from_dict(row.topology),
                {int(k): v for k, v in row.queues.items()},
                row.recorded_at,
            )
            for row in rows
        ]

    def place(self, count: int, busy_queues: Iterable[str] = ()) -> Placement | None:
        return place_on(self.nodes(), count, busy_queues)


def place_on(
    nodes: Iterable[GpuNode], count: int, busy_queues: Iterable[str] = ()
) -> Placement | None:
    """`count` GPUs on one node, every two sharing NVLinks, none of them busy: the node
    whose best set has the widest narrowest link (then fewest NUMA nodes, then name). A node
    without queues (a topology read from a file) offers all its GPUs."""
    busy = set(busy_queues)
    best: tuple[tuple[int, int, str], Placement] | None = None
    for node in nodes:
        free = [g for g, queue in node.queues.items() if queue not in busy] if node.queues else None
        chosen = node.topology.place(count, free=free)
        if chosen is None:
            continue
        width = node.topology.narrowest(chosen)
        key = (-width, node.topology.numa_nodes(chosen), node.host)
        if best is None or key < best[0]:
            queues = [node.queues.get(g, "") for g in chosen]
            best = (key, Placement(node.host, chosen, queues, width))
    return best[1] if best else None
