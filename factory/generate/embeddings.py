"""The prompt-embedding cache: text encoding once per (model, text encoder, prompt, negative
prompt, max length), shared by every worker.

The index lives in the database (one row per key, kept after eviction so an entry's access
history survives re-admission); the blobs live in the store (`cache/embeddings/…`) or in
Redis. Eviction is LRU-K with K = 2 under a byte bound: the victim is the stored entry whose
second-most-recent access is oldest, and entries used only once go first (oldest first),
so a one-off sweep of new prompts cannot push out the prompts a batch keeps reusing.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import redis
from sqlalchemy import func, select, update

from factory.db.models import prompt_embeddings, utcnow
from factory.db.session import Database
from factory.store.base import Store

log = logging.getLogger("factory.embeddings")  # its name before issue 36

BLOB_PREFIX = "cache/embeddings"
REDIS_PREFIX = "factory:embeddings:"


def cache_key(model: str, encoder: str, prompt: str, negative: str, max_length: int) -> str:
    parts = (model, encoder, prompt, negative, str(max_length))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


class Blobs(Protocol):
    def get(self, key: str) -> bytes | None: ...

    def put(self, key: str, data: bytes) -> None: ...

    def delete(self, key: str) -> None: ...


class StoreBlobs:
    def __init__(self, store: Store) -> None:
        self.store = store

    def _key(self, key: str) -> str:
        return f"{BLOB_PREFIX}/{key[:2]}/{key}.safetensors"

    def get(self, key: str) -> bytes | None:
        if not self.store.exists(self._key(key)):
            return None
        with self.store.local_path(self._key(key)) as path:
            return path.read_bytes()

    def put(self, key: str, data: bytes) -> None:
        self.store.put_bytes(self._key(key), data)

    def delete(self, key: str) -> None:
        self.store.delete(self._key(key))


class RedisBlobs:
    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url, socket_timeout=30, socket_connect_timeout=10)

    def get(self, key: str) -> bytes | None:
        return self.client.get(REDIS_PREFIX + key)  # type: ignore[return-value]

    def put(self, key: str, data: bytes) -> None:
        self.client.set(REDIS_PREFIX + key, data)

    def delete(self, key: str) -> None:
        self.client.delete(REDIS_PREFIX + key)


@dataclass(frozen=True)
class CacheStats:
    entries: int
    bytes: int
    capacity: int
    hits: int
    misses: int

    @property
    def hit_rate(self) -> float | None:
        total = self.hits + self.misses
        return self.hits / total if total else None


@dataclass(eq=False)  # one cache is one cache: compared and hashed by identity
class EmbeddingCache:
    database: Database
    blobs: Blobs
    capacity: int
    clock: Callable[[], float] = time.time

    def get(self, key: str) -> bytes | None:
        """The blob, recording the access (a hit); None when absent (the caller encodes and
        `put`s, which records the miss)."""
        table = prompt_embeddings
        with self.database.connect() as conn:
            row = conn.execute(select(table).where(table.c.key == key)).first()
        if row is None or not row.stored:
            return None
        data = self.blobs.get(key)
        if data is None:  # the blob went away behind the index's back
            self._mark_evicted(key)
            return None
        with self.database.transaction() as conn:
            conn.execute(
                update(table)
                .where(table.c.key == key)
                .values(
                    hits=table.c.hits + 1,
                    previous_access=table.c.last_access,
                    last_access=self.clock(),
                )
            )
        return data

    def contains(self, key: str) -> bool:
        """Whether the key is stored (no access recorded: `get` is what counts as a use)."""
        table = prompt_embeddings
        with self.database.connect() as conn:
            stored = conn.scalar(select(table.c.stored).where(table.c.key == key))
        return bool(stored)

    def put(self, key: str, model: str, data: bytes) -> bool:
        """Store a freshly encoded blob (a miss); False when it is larger than the whole cache."""
        size = len(data)
        if size > self.capacity:
            log.warning("embeddings.too_large", extra={"size": size, "capacity": self.capacity})
            self._record(key, model, size, stored=False)
            return False
        self._evict_for(size, keep=key)
        self.blobs.put(key, data)
        self._record(key, model, size, stored=True)
        return True

    def stats(self) -> CacheStats:
        table = prompt_embeddings
        with self.database.connect() as conn:
            stored = conn.execute(
                select(func.count(), func.coalesce(func.sum(table.c.size), 0)).where(
                    table.c.stored.is_(True)
                )
            ).one()
            counts = conn.execute(
                select(
                    func.coalesce(func.sum(table.c.hits), 0),
                    func.coalesce(func.sum(table.c.misses), 0),
                )
            ).one()
        return CacheStats(
            int(stored[0]), int(stored[1]), self.capacity, int(counts[0]), int(counts[1])
        )

    def stored_keys(self) -> set[str]:
        table = prompt_embeddings
        with self.database.connect() as conn:
            return set(conn.scalars(select(table.c.key).where(table.c.stored.is_(True))))

    # -- internals -------------------------------------------------------------------------

    def _record(self, key: str, model: str, size: int, *, stored: bool) -> None:
        table = prompt_embeddings
        now = self.clock()
        with self.database.transaction() as conn:
            row = conn.execute(select(table).where(table.c.key == key)).first()
            if row is None:
                conn.execute(
                    table.insert().values(
                        key=key,
                        model=model,
                        size=size,
                        stored=stored,
                        last_access=now,
                        previous_access=None,
                        hits=0,
                        misses=1,
                        created_at=utcnow(),
                    )
                )
            else:  # re-admitted after eviction: its history continues
                conn.execute(
                    update(table)
                    .where(table.c.key == key)
                    .values(
                        size=size,
                        stored=stored,
                        misses=table.c.misses + 1,
                        previous_access=table.c.last_access,
                        last_access=now,
                    )
                )

    def _evict_for(self, size: int, keep: str) -> None:
        """Evict LRU-2 victims until `size` more bytes fit under the bound."""
        table = prompt_embeddings
        with self.database.transaction() as conn:
            rows = conn.execute(
                select(
                    table.c.key, table.c.size, table.c.last_access, table.c.previous_access
                ).where(table.c.stored.is_(True), table.c.key != keep)
            ).all()
            used = sum(r.size for r in rows)
            victims = []
            # Backward 2-distance: entries seen once (no previous access) are infinitely far.
            for row in sorted(
                rows,
                key=lambda r: (
                    r.previous_access is not None,
                    r.previous_access or 0.0,
                    r.last_access,
                ),
            ):
                if used + size <= self.capacity:
                    break
                victims.append(row.key)
                used -= row.size
            if victims:
                conn.execute(update(table).where(table.c.key.in_(victims)).values(stored=False))
        for key in victims:
            self.blobs.delete(key)
            log.info("embeddings.evicted", extra={"key": key})

    def _mark_evicted(self, key: str) -> None:
        table = prompt_embeddings
        with self.database.transaction() as conn:
            conn.execute(update(table).where(table.c.key == key).values(stored=False))
