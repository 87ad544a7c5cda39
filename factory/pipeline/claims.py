"""Claims on a chunk being encoded: who encodes it now, so that a second taker (the chunk
message and the encode stage both find the last chunk missing) waits for that encode
instead of making a second one and writing other bytes over the first.

With Redis (FACTORY_REDIS_URL, or the broker's Redis on Celery workers) a claim is a key set
with ``SET NX PX`` holding a random token, renewed while the encode runs and removed by its
holder only (compare and delete); a holder that dies stops renewing and its claim expires
after ``ttl`` seconds, and a waiter then claims the chunk itself. Without Redis (the
embedded path: one process) the claims live in the process. The same claims are the leases
on a video's shots (tasks/jobs.py). A claim held fails closed (`_RedisClaim`): its holder
is told it lost it at the first Redis error or a renewal late past its deadline. Redis
being unreachable when a chunk is to be claimed does not stop an encode: it runs unclaimed
(a second encode may happen again, and stays harmless for the quality gate, whose
measurements are named by the chunk's bytes: chunk_qc.py); a shot is then not taken.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

import redis

log = logging.getLogger(__name__)

PREFIX = "factory:claim:"
TTL = 30.0  # seconds a claim outlives its holder's last renewal (renewed every TTL/3)
# The holder's own deadline: a claim whose last renewal was sent longer ago than this share
# of the TTL counts as lost to its holder, well before Redis lets another take it.
RENEW_DEADLINE = 0.5

_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""


class Claim(Protocol):
    @property
    def holder(self) -> str:
        """This claim's own id (its token's first 12 hex digits): what a shot's holder names
        its files and fences its records with."""
        ...

    def held(self) -> bool:
        """Whether the claim is still this holder's (asked right before the chunk is put)."""
        ...


class Claims(Protocol):
    def hold(self, key: str) -> AbstractContextManager[Claim | None]:
        """The claim on ``key`` while the block runs, or None when another holder has it."""
        ...

    def held(self, key: str) -> bool:
        """Whether anyone holds ``key`` now (True when it cannot be told)."""
        ...

    def once(self, key: str, seconds: float) -> bool:
        """True the first time in ``seconds`` it is asked for ``key`` (an idempotency token:
        `SET NX` with an expiry)."""
        ...


class Unclaimed:
    """Redis could not be asked: the encode runs without a claim (a shot is not taken)."""

    def held(self) -> bool:
        return True


class RedisClaims:
    def __init__(self, url: str, ttl: float = TTL) -> None:
        self.client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        self.ttl = ttl

    @contextmanager
    def hold(self, key: str) -> Iterator[Claim | None]:
        """The claim on ``key`` (a chunk's store key) while the block runs, or None when
        another holder has it."""
        name, token = PREFIX + key, uuid.uuid4().hex
        asked = time.monotonic()  # the lease runs from no later than this
        try:
            got = bool(self.client.set(name, token, nx=True, px=int(self.ttl * 1000)))
        except redis.RedisError as exc:
            log.warning("chunk.claim_unavailable", extra={"key": key, "error": str(exc)})
            yield Unclaimed()
            return
        if not got:
            yield None
            return
        claim = _RedisClaim(self.client, name, token, self.ttl, asked)
        try:
            yield claim
        finally:
            claim.release()

    def held(self, key: str) -> bool:
        try:
            return bool(self.client.exists(PREFIX + key))
        except redis.RedisError:
            return True

    def once(self, key: str, seconds: float) -> bool:
        try:
            return bool(self.client.set(PREFIX + key, b"1", nx=True, px=int(seconds * 1000)))
        except redis.RedisError:
            return False


class _RedisClaim:
    """A claim that fails closed: it counts as lost from the first Redis error, from a
    renewal refused, and from the moment its last renewal is older than ``RENEW_DEADLINE``
    of the TTL (counted from when that renewal was sent), so a holder cut off from Redis,
    or one that froze, stops writing well before another could have taken the key."""

    def __init__(self, client: redis.Redis, name: str, token: str, ttl: float,
                 asked: float) -> None:  # fmt: skip
        self.client, self.name, self.token, self.ttl = client, name, token, ttl
        self.token_bytes = token.encode()
        self._lost = False
        self._valid_until = asked + ttl * RENEW_DEADLINE
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="claim-renewal", daemon=True)
        self._thread.start()

    @property
    def holder(self) -> str:
        return self.token[:12]

    def _renew(self) -> None:
        while not self._done.wait(self.ttl / 3):
            sent = time.monotonic()
            try:
                kept = self.client.eval(_RENEW, 1, self.name, self.token, int(self.ttl * 1000))
            except redis.RedisError as exc:
                self._lose("renewal failed", exc)
                return
            if not kept:
                self._lose("renewal refused: another holder has it")
                return
            self._valid_until = sent + self.ttl * RENEW_DEADLINE

    def _lose(self, why: str, error: Exception | None = None) -> None:
        if not self._lost:
            self._lost = True
            extra = {"key": self.name, "why": why, **({"error": str(error)} if error else {})}
            log.warning("claim.lost", extra=extra)

    def held(self) -> bool:
        if self._lost:
            return False
        if time.monotonic() >= self._valid_until:
            self._lose("not renewed in time")
            return False
        try:
            mine = self.client.get(self.name) == self.token_bytes
        except redis.RedisError as exc:
            self._lose("Redis cannot answer", exc)
            return False
        if not mine:
            self._lose("another holder has it")
        return mine and time.monotonic() < self._valid_until

    def release(self) -> None:
        self._done.set()
        try:
            self.client.eval(_RELEASE, 1, self.name, self.token)
        except redis.RedisError as exc:  # it expires by itself
            log.warning("chunk.claim_not_released", extra={"key": self.name, "error": str(exc)})


class LocalClaims:
    """Claims within one process (threads): the embedded path."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, str] = {}

    @contextmanager
    def hold(self, key: str) -> Iterator[Claim | None]:
        token = uuid.uuid4().hex
        with self._lock:
            if key in self._held:
                got = False
            else:
                self._held[key] = token
                got = True
        if not got:
            yield None
            return
        try:
            yield _LocalClaim(self, key, token)
        finally:
            with self._lock:
                if self._held.get(key) == token:
                    del self._held[key]

    def held(self, key: str) -> bool:
        with self._lock:
            return key in self._held

    def once(self, key: str, seconds: float) -> bool:
        return True  # one process: nothing else sends it


class _LocalClaim:
    def __init__(self, owner: LocalClaims, key: str, token: str) -> None:
        self.owner, self.key, self.token = owner, key, token

    @property
    def holder(self) -> str:
        return self.token[:12]

    def held(self) -> bool:
        with self.owner._lock:
            return self.owner._held.get(self.key) == self.token


LOCAL = LocalClaims()  # the process's own, where no Redis is configured


def open_claims(
    redis_url: str | None, broker_url: str | None = None, ttl: float = TTL
) -> RedisClaims | LocalClaims:
    """Redis claims when there is a Redis (FACTORY_REDIS_URL, else a Redis broker), else the
    process's own. ``ttl``: FACTORY_LEASE_SECONDS."""
    url = redis_url or broker_url
    if url and url.startswith(("redis://", "rediss://", "unix://")):
        return RedisClaims(url, ttl)
    return LOCAL
