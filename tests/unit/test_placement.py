"""The consistent-hash ring that splits asset warming between nodes."""

from __future__ import annotations

from collections import Counter

import pytest

from factory.store.placement import HashRing

KEYS = [f"s3://assets/beds/bed-{i:05d}.flac" for i in range(20_000)]


def test_assets_spread_evenly_over_the_nodes() -> None:
    ring = HashRing(["gpu-a", "gpu-b", "gpu-c", "gpu-d"])
    counts = Counter(ring.owners(key)[0] for key in KEYS)
    assert set(counts) == {"gpu-a", "gpu-b", "gpu-c", "gpu-d"}
    for count in counts.values():
        assert abs(count - len(KEYS) / 4) < 0.15 * len(KEYS) / 4


def test_adding_a_node_moves_only_what_the_new_node_takes() -> None:
    before = HashRing(["gpu-a", "gpu-b", "gpu-c", "gpu-d"])
    after = HashRing(["gpu-a", "gpu-b", "gpu-c", "gpu-d", "gpu-e"])
    moved = [key for key in KEYS if before.owners(key) != after.owners(key)]
    assert all(after.owners(key) == ["gpu-e"] for key in moved)  # nothing reshuffled
    assert 0.12 < len(moved) / len(KEYS) < 0.28  # about 1/5


def test_removing_a_node_moves_only_its_own_assets() -> None:
    before = HashRing(["gpu-a", "gpu-b", "gpu-c"])
    after = HashRing(["gpu-a", "gpu-c"])
    for key in KEYS[:5000]:
        if before.owners(key) != ["gpu-b"]:
            assert after.owners(key) == before.owners(key)


def test_replicas_are_distinct_and_the_order_is_stable() -> None:
    ring = HashRing(["a", "b", "c"])
    for key in KEYS[:500]:
        owners = ring.owners(key, replicas=2)
        assert len(owners) == 2 and len(set(owners)) == 2
        assert owners[0] == ring.owners(key)[0]
        assert HashRing(["c", "b", "a"]).owners(key, 2) == owners  # node order does not matter
    assert len(ring.owners(KEYS[0], replicas=10)) == 3
    assert ring.owns("a", KEYS[0], 3)


def test_the_ring_is_the_same_in_every_process() -> None:
    # xxhash64 (seed 0) is not salted per process, unlike Python's hash(): pinned values.
    from factory.store.placement import _point

    assert _point("x") == 6665539201184043299
    assert _point("s3://assets/beds/harbor.flac") == 7226891489290315410


def test_an_empty_ring_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one node"):
        HashRing([])
