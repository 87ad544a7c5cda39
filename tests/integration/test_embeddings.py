"""The prompt-embedding cache: LRU-K (K = 2) eviction under a byte bound, its index in the real
database (SQLite and PostgreSQL), blobs in the file store or in a real Redis."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factory.db import migrate
from factory.db.session import Database
from factory.generate.embeddings import EmbeddingCache, RedisBlobs, StoreBlobs, cache_key
from factory.store.file import FileStore


class Clock:
    def __init__(self) -> None:
        self.ticks = itertools.count(1)

    def __call__(self) -> float:
        return float(next(self.ticks))


@pytest.fixture
def database(any_url: str):
    database = Database(any_url)
    migrate.upgrade(database)
    yield database
    database.dispose()


@pytest.fixture
def cache(database: Database, tmp_path: Path) -> EmbeddingCache:
    return EmbeddingCache(database, StoreBlobs(FileStore(tmp_path / "store")), 30, Clock())


def blob(name: str) -> bytes:
    return name.encode().ljust(10, b".")  # 10 bytes each: the cache holds three


def test_the_key_covers_model_encoder_prompt_negative_and_length():
    base = ("wan:/m", "enc1", "a harbor", "blurry", 512)
    keys = {cache_key(*base)}
    for i, changed in enumerate(("wan:/n", "enc2", "a forest", "", 256)):
        keys.add(cache_key(*base[:i], changed, *base[i + 1 :]))  # type: ignore[arg-type]
    assert len(keys) == 6 and cache_key(*base) == cache_key(*base)


def test_a_miss_then_hits_are_counted(cache: EmbeddingCache):
    assert cache.get("a") is None and not cache.contains("a")
    assert cache.put("a", "m", blob("a"))
    assert cache.contains("a")  # looking does not count as a use
    assert cache.get("a") == blob("a") and cache.get("a") == blob("a")
    stats = cache.stats()
    assert (stats.entries, stats.bytes, stats.hits, stats.misses) == (1, 10, 2, 1)
    assert stats.hit_rate == pytest.approx(2 / 3)


def test_entries_used_once_are_evicted_before_entries_used_twice(cache: EmbeddingCache):
    for name in "abc":
        cache.put(name, "m", blob(name))
    cache.get("a")  # a and b now have two accesses each; c has one, and is the most recent
    cache.get("b")
    cache.put("d", "m", blob("d"))
    assert cache.stored_keys() == {"a", "b", "d"}  # plain LRU would have evicted a
    cache.put("e", "m", blob("e"))
    assert cache.stored_keys() == {"a", "b", "e"}  # d: used once
    for name in "fgh":  # a scan of one-off prompts never pushes out the reused ones
        cache.put(name, "m", blob(name))
    assert {"a", "b"} <= cache.stored_keys()


def test_among_entries_used_twice_the_oldest_second_access_goes(cache: EmbeddingCache):
    for name in "abc":
        cache.put(name, "m", blob(name))
    for name in "cbac":
        cache.get(name)
    cache.put("d", "m", blob("d"))
    # a's second-most-recent access (its put) is the oldest; plain LRU would have evicted b.
    assert cache.stored_keys() == {"b", "c", "d"}


def test_an_evicted_entry_keeps_its_history_when_it_returns(cache: EmbeddingCache):
    for name in "abc":
        cache.put(name, "m", blob(name))
    cache.get("a")
    cache.get("b")
    cache.put("d", "m", blob("d"))  # evicts c
    assert cache.get("c") is None
    cache.put("c", "m", blob("c"))  # re-admitted: with its earlier access it counts as used twice
    cache.put("e", "m", blob("e"))
    assert "c" in cache.stored_keys() and "d" not in cache.stored_keys()
    assert cache.stats().misses == 6  # a b c d, c again, e


def test_a_blob_larger_than_the_cache_is_not_stored(cache: EmbeddingCache):
    cache.put("a", "m", blob("a"))
    assert cache.put("huge", "m", b"x" * 31) is False
    assert cache.stored_keys() == {"a"} and cache.get("huge") is None


def test_a_blob_gone_behind_the_index_is_a_miss(cache: EmbeddingCache, tmp_path: Path):
    cache.put("a", "m", blob("a"))
    for path in (tmp_path / "store").rglob("*.safetensors"):
        path.unlink()
    assert cache.get("a") is None and cache.stored_keys() == set()


def test_blobs_in_redis(database: Database, redis_url: str):
    cache = EmbeddingCache(database, RedisBlobs(redis_url), 30, Clock())
    for name in "abcd":
        cache.put(name, "m", blob(name))
    assert cache.get("d") == blob("d")
    assert RedisBlobs(redis_url).get("a") is None  # evicted from Redis too


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(st.sampled_from(["put", "get"]), st.sampled_from("abcdefg"), st.integers(1, 14)),
        max_size=40,
    )
)
def test_the_bound_holds_and_the_index_matches_the_blobs(tmp_path_factory, operations):
    root = tmp_path_factory.mktemp("lruk")
    database = Database(f"sqlite:///{root / 'f.db'}")
    migrate.upgrade(database)
    store = FileStore(root / "store")
    cache = EmbeddingCache(database, StoreBlobs(store), 30, Clock())
    for op, key, size in operations:
        if op == "put":
            cache.put(key, "m", b"x" * size)
        else:
            cache.get(key)
        stats = cache.stats()
        assert stats.bytes <= 30
        on_disk = {p.stem for p in (root / "store").rglob("*.safetensors")}
        assert on_disk == cache.stored_keys()
    database.dispose()
