"""The Redis fast path for idempotent submission: one ``SET NX`` token per job id, with a TTL.

The token holds the spec's sha256. It only saves work: when every job of a resubmitted
manifest already has a token with the same hash, the submitter reads the jobs instead of
opening a write transaction. The database's unique job id is the guarantee in all cases,
so a lost, expired or stale token, or Redis being down, never loses or duplicates a job.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import redis

log = logging.getLogger("factory.idempotency")  # its name before issue 36

KEY_PREFIX = "factory:submit:"


@dataclass
class TokenClaims:
    ours: list[str] = field(default_factory=list)  # tokens this submitter set
    same: list[str] = field(default_factory=list)  # already there, same spec hash
    other: list[str] = field(default_factory=list)  # already there, another hash
    unavailable: bool = False  # Redis could not be reached: use the database alone

    @property
    def all_seen_before(self) -> bool:
        return not self.unavailable and not self.ours and not self.other


class SubmitTokens:
    def __init__(self, url: str, ttl_seconds: int) -> None:
        self.client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        self.ttl = ttl_seconds

    def claim(self, hashes: dict[str, str]) -> TokenClaims:
        """Try to set a token for every job id; report which were new and which existed."""
        claims = TokenClaims()
        try:
            pipe = self.client.pipeline(transaction=False)
            for job_id, sha in hashes.items():
                pipe.set(KEY_PREFIX + job_id, sha, nx=True, ex=self.ttl)
            results = pipe.execute()
            existing = [j for j, was_set in zip(hashes, results, strict=True) if not was_set]
            values = self.client.mget([KEY_PREFIX + j for j in existing]) if existing else []
        except redis.RedisError as exc:
            log.warning("submit.redis_unavailable", extra={"error": str(exc)})
            return TokenClaims(unavailable=True)
        claims.ours = [j for j, was_set in zip(hashes, results, strict=True) if was_set]
        for job_id, value in zip(existing, values, strict=True):
            same = value is not None and value.decode() == hashes[job_id]
            (claims.same if same else claims.other).append(job_id)
        return claims

    def confirm(self, hashes: dict[str, str]) -> None:
        """After a committed submission: tokens hold the hashes now in the database."""
        try:
            pipe = self.client.pipeline(transaction=False)
            for job_id, sha in hashes.items():
                pipe.set(KEY_PREFIX + job_id, sha, ex=self.ttl)
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("submit.redis_unavailable", extra={"error": str(exc)})

    def release(self, job_ids: list[str]) -> None:
        """Drop the tokens a failed submission set, so they do not hide its jobs' absence."""
        if not job_ids:
            return
        try:
            self.client.delete(*[KEY_PREFIX + j for j in job_ids])
        except redis.RedisError as exc:
            log.warning("submit.redis_unavailable", extra={"error": str(exc)})
