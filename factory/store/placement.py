"""Which node warms which asset: a consistent-hash ring (xxhash64) over the node names.

Each node appears at many points on the ring (virtual nodes), so the assets spread evenly,
and adding or removing one node moves only the assets that node gains or loses (about 1/N),
not a reshuffle of everything already warmed.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

import xxhash

VIRTUAL_NODES = 128


def _point(text: str) -> int:
    return xxhash.xxh64_intdigest(text.encode())


class HashRing:
    def __init__(self, nodes: Iterable[str], virtual_nodes: int = VIRTUAL_NODES) -> None:
        self.nodes = tuple(dict.fromkeys(nodes))
        if not self.nodes:
            raise ValueError("a ring needs at least one node")
        ring = sorted(
            (_point(f"{node}#{i}"), node) for node in self.nodes for i in range(virtual_nodes)
        )
        self._points = [point for point, _ in ring]
        self._owners = [node for _, node in ring]

    def owners(self, key: str, replicas: int = 1) -> list[str]:
        """The `replicas` distinct nodes that hold `key`, first owner first."""
        wanted = min(replicas, len(self.nodes))
        found: list[str] = []
        start = bisect.bisect(self._points, _point(key))
        for step in range(len(self._owners)):
            node = self._owners[(start + step) % len(self._owners)]
            if node not in found:
                found.append(node)
                if len(found) == wanted:
                    break
        return found

    def owns(self, node: str, key: str, replicas: int = 1) -> bool:
        return node in self.owners(key, replicas)
