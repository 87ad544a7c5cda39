"""The node-local asset cache against the real S3 stand (nginx mTLS + moto), and `factory
preload` splitting the warming between nodes by consistent hashing."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from factory.errors import PermanentError, RetryableError
from factory.infra.confinement import Confinement
from factory.store.assets import AssetCache
from factory.store.file import FileStore
from factory.store.placement import HashRing
from factory.store.s3 import S3Store
from tests.conftest import run_cli
from tests.footage import tone


@pytest.fixture
def s3_assets(s3_stand, bucket) -> S3Store:
    return S3Store(f"s3://{bucket}", s3_stand.settings())


def gets(s3_stand, uri: str, expected: int) -> int:
    """The gateway's GETs of `uri` so far. nginx logs a request after its response has gone
    out, so the client may be back before the line is written: wait (5 s at most) until
    `expected` lines are there, and give the count (more than expected returns at once)."""
    log = s3_stand.root / "gateway-access.log"
    deadline = time.monotonic() + 5
    while True:
        count = sum(1 for line in log.read_text().splitlines() if f'"GET {uri}"' in line)
        if count >= expected or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


def cache(tmp_path: Path, s3_stand, bucket: str, capacity: int = 1 << 30) -> AssetCache:
    allowed = Confinement(asset_roots=(tmp_path,), asset_buckets=(bucket,))
    return AssetCache(
        tmp_path / "assets", capacity, FileStore(tmp_path / "store"), s3_stand.settings(), allowed
    )


def test_a_miss_fetches_once_and_a_hit_reads_nothing(s3_stand, bucket, s3_assets, tmp_path):
    data = os.urandom(2 << 20)
    s3_assets.put_bytes("beds/harbor.flac", data)
    assets = cache(tmp_path, s3_stand, bucket)
    reference = f"s3://{bucket}/beds/harbor.flac"
    with assets.local_path(reference) as first:
        assert first.read_bytes() == data
    with assets.local_path(reference) as second:
        assert second == first and first.exists()  # kept for the next job
    assert gets(s3_stand, f"/{bucket}/beds/harbor.flac", 1) == 1
    assert assets.stats()["bytes"] == len(data)


def test_a_changed_asset_upstream_or_a_tampered_copy_is_fetched_again(
    s3_stand, bucket, s3_assets, tmp_path
):
    s3_assets.put_bytes("beds/a.flac", b"first version")
    assets = cache(tmp_path, s3_stand, bucket)
    reference = f"s3://{bucket}/beds/a.flac"
    with assets.local_path(reference) as path:
        assert path.read_bytes() == b"first version"
    s3_assets.put_bytes("beds/a.flac", b"second version")
    with assets.local_path(reference) as path:
        assert path.read_bytes() == b"second version"
    path.write_bytes(b"tampered-version")  # changed in place on this node
    with assets.local_path(reference) as path:
        assert path.read_bytes() == b"second version"
    assert gets(s3_stand, f"/{bucket}/beds/a.flac", 3) == 3


def test_least_recently_used_assets_are_evicted_to_stay_in_bounds(
    s3_stand, bucket, s3_assets, tmp_path
):
    for name in ("one", "two", "three"):
        s3_assets.put_bytes(f"beds/{name}", os.urandom(400_000))
    assets = cache(tmp_path, s3_stand, bucket, capacity=1_000_000)
    ref = {name: f"s3://{bucket}/beds/{name}" for name in ("one", "two", "three")}
    for name in ("one", "two"):
        with assets.local_path(ref[name]):
            pass
    with assets.local_path(ref["one"]):  # used again: "two" is now the oldest
        pass
    with assets.local_path(ref["three"]):
        pass
    stats = assets.stats()
    assert stats["objects"] == 2 and stats["bytes"] <= 1_000_000
    with assets.local_path(ref["one"]):
        pass
    assert gets(s3_stand, f"/{bucket}/beds/one", 1) == 1  # still cached
    with assets.local_path(ref["two"]):
        pass
    assert gets(s3_stand, f"/{bucket}/beds/two", 2) == 2  # was evicted


def test_an_asset_larger_than_the_cache_is_served_but_not_kept(
    s3_stand, bucket, s3_assets, tmp_path
):
    data = os.urandom(300_000)
    s3_assets.put_bytes("lora/big.safetensors", data)
    assets = cache(tmp_path, s3_stand, bucket, capacity=100_000)
    with assets.local_path(f"s3://{bucket}/lora/big.safetensors") as path:
        assert hashlib.sha256(path.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
    assert not path.exists() and assets.stats()["objects"] == 0


def test_with_the_gateway_down_a_cached_asset_is_still_served(
    s3_stand, bucket, s3_assets, tmp_path
):
    s3_assets.put_bytes("beds/kept.flac", b"kept bed")
    s3_assets.put_bytes("beds/never.flac", b"never fetched")
    assets = cache(tmp_path, s3_stand, bucket)
    with assets.local_path(f"s3://{bucket}/beds/kept.flac"):
        pass
    s3_stand.stop_gateway()
    try:
        with assets.local_path(f"s3://{bucket}/beds/kept.flac") as path:
            assert path.read_bytes() == b"kept bed"
        with (
            pytest.raises(RetryableError, match="cannot reach"),
            assets.local_path(f"s3://{bucket}/beds/never.flac"),
        ):
            pass
    finally:
        s3_stand.start_gateway()


def test_missing_assets_and_local_files(s3_stand, bucket, tmp_path):
    assets = cache(tmp_path, s3_stand, bucket)
    with (
        pytest.raises(PermanentError, match="does not exist"),
        assets.local_path(f"s3://{bucket}/beds/nothing.flac"),
    ):
        pass
    local = tmp_path / "bed.flac"
    local.write_bytes(b"local bed")
    with assets.local_path(local.as_uri()) as path:
        assert path.read_bytes() == b"local bed" and path != local
    FileStore(tmp_path / "store").put_bytes("beds/in-store.flac", b"store bed")
    with assets.local_path("beds/in-store.flac") as path:
        assert path.read_bytes() == b"store bed"


def test_preload_splits_the_assets_between_nodes_by_consistent_hashing(
    s3_stand, bucket, s3_assets, tmp_path
):
    names = [f"bed-{i}.flac" for i in range(24)]
    for i, name in enumerate(names):  # 24 contents (submit's check decodes each)
        s3_assets.put_file(f"beds/{name}", tone(tmp_path / name, frequency=200 + 20 * i))
    lines = ["batch: warm", "defaults: {duration: 4, resolution: 96x64}", "videos:"]
    lines += [
        f"  - {{id: v{i}, prompt: p, audio: {{asset: 's3://{bucket}/beds/{name}'}}}}"
        for i, name in enumerate(names)
    ]
    manifest = tmp_path / "m.yaml"
    manifest.write_text("\n".join(lines) + "\n")
    reports = {}
    for node in ("node-a", "node-b", "node-c"):
        env = {
            **s3_stand.env(f"s3://{bucket}/out"),
            "FACTORY_HOME": str(tmp_path / node),
            "FACTORY_DATABASE_URL": "",
            "FACTORY_BROKER_URL": "",
            "FACTORY_REDIS_URL": "",
            "FACTORY_NODE_NAME": node,
            "FACTORY_NODES": "node-a,node-b,node-c",
        }
        done = run_cli("preload", str(manifest), "--json", env=env)
        assert done.returncode == 0, done.stderr
        reports[node] = json.loads(done.stdout)["assets"]
        again = json.loads(run_cli("preload", str(manifest), "--json", env=env).stdout)["assets"]
        assert (again["hits"], again["misses"]) == (reports[node]["misses"], 0)
    text = run_cli("preload", str(manifest), env=env).stdout
    assert "24 referenced" in text and "already cached" in text and "warmed by node-" in text
    ring = HashRing(["node-a", "node-b", "node-c"])
    warmed = {node: {i["asset"] for i in r["items"] if i["outcome"] == "fetched"}
              for node, r in reports.items()}  # fmt: skip
    every = {f"s3://{bucket}/beds/{name}" for name in names}
    assert set().union(*warmed.values()) == every  # each asset warmed once, somewhere
    assert sum(len(w) for w in warmed.values()) == len(every)
    for node, assets in warmed.items():
        assert all(ring.owners(a) == [node] for a in assets)
        index = tmp_path / node / "assets" / "index.json"
        cached = json.loads(index.read_text())["references"] if index.exists() else {}
        assert set(cached) == assets
        assert reports[node]["skipped"] == len(every) - len(assets)
