"""The node-local asset cache: audio beds (and other files manifests name) fetched once from
the store into a bounded folder, checked by sha256, evicted least-recently-used first.

A reference is a store URL (`s3://bucket/key`, `file:///path`) or a key in the factory's
own store. Files are kept by content (`objects/<sha256>`), with an index from reference to
content, so two references to the same bytes take the space once. Processes on one node
share the folder: the index is changed under a file lock, a download happens once per
reference at a time, and a file appears under its final name only complete and checked.

The cache holds copies of whatever the factory may read, so it is private to the factory's
user: folders 0700, files 0600, whatever the source file's mode was. References outside
the operator's confinement (factory/infra/confinement.py) are refused before anything is read.

If the store cannot be reached but the cache holds the reference, the cached copy is used
(with a warning): an outage of the gateway does not stop a mux that has its audio bed.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

if TYPE_CHECKING:
    from factory.config import Settings

from factory.config.s3 import S3Settings
from factory.errors import BadInput, PermanentError, RetryableError
from factory.infra.confinement import Confinement
from factory.store.base import ObjectInfo, Store
from factory.store.placement import HashRing

log = logging.getLogger("factory.assets")
INDEX = "index.json"


@dataclass
class WarmResult:
    hits: int = 0
    misses: int = 0
    skipped: int = 0  # owned by other nodes
    bytes_fetched: int = 0
    owners: dict[str, list[str]] = field(default_factory=dict)  # reference -> nodes


@dataclass(eq=False)  # one cache is one cache: compared and hashed by identity
class AssetCache:
    root: Path
    capacity: int
    store: Store
    s3: S3Settings = field(default_factory=S3Settings)
    confinement: Confinement = field(default_factory=Confinement)
    _stores: dict[str, Store] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        for folder in (self.root, self.root / "objects", self.root / "locks"):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(folder, 0o700)  # mkdir's mode is masked by the umask

    # --- use ----------------------------------------------------------------------------

    @contextmanager
    def local_path(self, reference: str) -> Iterator[Path]:
        """The asset as a local file: from the cache, or fetched now (and kept if it fits)."""
        path, kept = self._ensure(reference)
        try:
            yield path
        finally:
            if not kept:
                path.unlink(missing_ok=True)

    def warm(
        self,
        references: list[str],
        *,
        ring: HashRing | None = None,
        node: str = "",
        replicas: int = 1,
        on_each: Callable[[str, str], None] | None = None,
    ) -> WarmResult:
        """Fetch the references this node owns on the ring (all of them without a ring)."""
        result = WarmResult()
        for reference in dict.fromkeys(references):
            owners = ring.owners(reference, replicas) if ring else [node]
            result.owners[reference] = owners
            if ring and node not in owners:
                result.skipped += 1
                outcome = "skipped"
            else:
                before = self._cached(reference)
                path, kept = self._ensure(reference)
                if not kept:
                    path.unlink(missing_ok=True)
                if before:
                    result.hits += 1
                    outcome = "hit"
                else:
                    result.misses += 1
                    result.bytes_fetched += path.stat().st_size if kept else 0
                    outcome = "fetched"
            if on_each:
                on_each(reference, outcome)
        return result

    def stats(self) -> dict[str, Any]:
        with self._locked_index() as index:
            entries = index["objects"]
            return {
                "objects": len(entries),
                "references": len(index["references"]),
                "bytes": sum(e["size"] for e in entries.values()),
                "capacity": self.capacity,
            }

    # --- inside -------------------------------------------------------------------------

    def _ensure(self, reference: str) -> tuple[Path, bool]:
        store, key = self._resolve(reference)
        try:
            info = store.stat(key)
        except RetryableError:
            cached = self._cached(reference)
            if cached is None:
                raise
            log.warning("asset.stale_copy", extra={"asset": reference, "reason": "store down"})
            return cached, True
        if info is None:
            raise PermanentError(
                f"asset {reference} does not exist in the store; upload it with "
                f"`factory store put FILE KEY` and requeue the job"
            )
        cached = self._cached(reference, info)
        if cached is not None:
            return cached, True
        with self._download_lock(reference):
            cached = self._cached(reference, info)  # another process may have fetched it
            if cached is not None:
                return cached, True
            return self._fetch(reference, store, key, info)

    def _fetch(self, reference: str, store: Store, key: str, info: ObjectInfo) -> tuple[Path, bool]:
        tmp = self.root / "objects" / f".fetch-{os.getpid()}-{time.monotonic_ns()}"
        try:
            sha256 = _copy_checked(store, key, tmp, info)
            os.chmod(tmp, 0o600)
            size = tmp.stat().st_size
            if size > self.capacity:
                log.info("asset.not_kept", extra={"asset": reference, "bytes": size})
                return tmp, False
            target = self._object_path(sha256)
            with self._locked_index() as index:
                self._evict(index, room_for=size, keep=sha256)
                os.replace(tmp, target)
                index["objects"][sha256] = {
                    "size": size, "used": time.time(), "mtime_ns": target.stat().st_mtime_ns
                }  # fmt: skip
                index["references"][reference] = {
                    "sha256": sha256, "remote_sha256": info.sha256, "etag": info.etag,
                    "size": size,
                }  # fmt: skip
            log.info("asset.fetched", extra={"asset": reference, "bytes": size})
            return target, True
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _cached(self, reference: str, info: ObjectInfo | None = None) -> Path | None:
        """The cached file for reference if present, intact in size and, given the store's
        current facts, still the same content; marks it used."""
        with self._locked_index() as index:
            entry = index["references"].get(reference)
            if entry is None:
                return None
            path = self._object_path(entry["sha256"])
            kept = index["objects"].get(entry["sha256"], {})
            if not path.is_file() or (path.stat().st_size, path.stat().st_mtime_ns) != (
                entry["size"],
                kept.get("mtime_ns"),
            ):  # gone, or changed in place since it was checked: fetch again
                path.unlink(missing_ok=True)
                index["references"].pop(reference, None)
                index["objects"].pop(entry["sha256"], None)
                return None
            if info is not None and not _same_content(entry, info):
                index["references"].pop(reference, None)  # changed upstream: fetch again
                return None
            kept["used"] = time.time()
            return path

    def _evict(self, index: dict[str, Any], *, room_for: int, keep: str) -> None:
        objects = index["objects"]
        total = sum(e["size"] for e in objects.values())
        for sha256, entry in sorted(objects.items(), key=lambda item: item[1].get("used", 0)):
            if total + room_for <= self.capacity:
                break
            if sha256 == keep:
                continue
            self._object_path(sha256).unlink(missing_ok=True)
            del objects[sha256]
            total -= entry["size"]
            for ref in [r for r, e in index["references"].items() if e["sha256"] == sha256]:
                del index["references"][ref]
            log.info("asset.evicted", extra={"sha256": sha256, "bytes": entry["size"]})

    def _resolve(self, reference: str) -> tuple[Store, str]:
        self.confinement.check_asset(reference)
        if reference.startswith("s3://"):
            parsed = urlparse(reference)
            base = f"s3://{parsed.netloc}"
            if base not in self._stores:
                from factory.store.s3 import S3Store

                self._stores[base] = S3Store(base, self.s3)
            return self._stores[base], parsed.path.lstrip("/")
        if reference.startswith("file://"):
            path = Path(unquote(urlparse(reference).path))
            return _OneFile(path), path.name
        if "://" in reference:
            raise BadInput(f"{reference!r}: assets are s3://, file:// or store keys", field="asset")
        return self.store, reference

    def _object_path(self, sha256: str) -> Path:
        return self.root / "objects" / sha256

    @contextmanager
    def _locked_index(self) -> Iterator[dict[str, Any]]:
        with open(self.root / ".lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = self.root / INDEX
            try:
                index = json.loads(path.read_text()) if path.exists() else {}
            except json.JSONDecodeError:
                index = {}  # a damaged index forgets the cache; the files are re-fetched
            index.setdefault("objects", {})
            index.setdefault("references", {})
            before = json.dumps(index, sort_keys=True)
            yield index
            after = json.dumps(index, sort_keys=True)
            if after != before:
                tmp = path.with_suffix(".tmp")
                with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
                    out.write(after)
                os.replace(tmp, path)

    @contextmanager
    def _download_lock(self, reference: str) -> Iterator[None]:
        name = hashlib.sha256(reference.encode()).hexdigest()[:32]
        with open(self.root / "locks" / name, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield


def _same_content(entry: dict[str, Any], info: ObjectInfo) -> bool:
    if info.sha256:
        return info.sha256 in (entry["sha256"], entry.get("remote_sha256"))
    return bool(info.etag) and info.etag == entry.get("etag") and info.size == entry["size"]


def _copy_checked(store: Store, key: str, target: Path, info: ObjectInfo) -> str:
    """Copy the object to target; its sha256, checked against the store's when it has one."""
    download = getattr(store, "download", None)
    if download is not None:  # s3: straight into target, checked on the way
        return download(key, target).sha256
    with store.local_path(key) as source:
        digest = hashlib.sha256()
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(source, "rb") as src, open(fd, "wb") as out:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
    sha256 = digest.hexdigest()
    if info.sha256 and sha256 != info.sha256:
        raise RetryableError(f"asset {key}: fetched bytes do not match the store's sha256")
    return sha256


class _OneFile:
    """A `file:///path` asset seen through the Store methods the cache uses."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.url = path.as_uri()

    def stat(self, key: str) -> ObjectInfo | None:
        if not self.path.is_file():
            return None
        st = self.path.stat()
        return ObjectInfo(st.st_size, None, f"{st.st_size}-{st.st_mtime_ns}")

    @contextmanager
    def local_path(self, key: str) -> Iterator[Path]:
        yield self.path


def open_asset_cache(settings: Settings, store: Store) -> AssetCache:
    root = settings.asset_cache_dir or settings.home / "assets"
    return AssetCache(root, settings.asset_cache_bytes, store, settings.s3, settings.confinement)


def node_ring(settings: Settings) -> HashRing:
    return HashRing(settings.nodes)
