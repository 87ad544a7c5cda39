"""Looking into the Redis broker: which jobs still have a message waiting in a queue.

The sweeper leaves those alone: a job waiting for a free GPU is not stale. A message in a
GPU worker's own queue only counts while that worker is alive (its alive key exists);
otherwise nobody will ever take it, and the job is swept onto the shared queue.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import redis

from tasks.queues import ALIVE_PREFIX, CPU, GPU_SHARED


def client(broker_url: str) -> redis.Redis:
    return redis.Redis.from_url(broker_url, socket_timeout=10, socket_connect_timeout=10)


def messages(conn: redis.Redis, queue: str) -> Iterator[tuple[bytes, dict]]:
    """(raw message, headers) of every message waiting in ``queue``."""
    for raw in conn.lrange(queue, 0, -1):
        try:
            yield raw, json.loads(raw).get("headers") or {}
        except (ValueError, AttributeError):
            continue


def message_args(raw: bytes) -> list:
    message = json.loads(raw)
    body = message["body"]
    if message.get("properties", {}).get("body_encoding") == "base64":
        body = base64.b64decode(body)
    return json.loads(body)[0]


def live_queues(conn: redis.Redis) -> list[str]:
    alive = [key.decode()[len(ALIVE_PREFIX) :] for key in conn.scan_iter(f"{ALIVE_PREFIX}*")]
    return [GPU_SHARED, CPU, *alive]


def waiting_job_ids(broker_url: str) -> set[str]:
    conn = client(broker_url)
    return {
        headers["job_id"]
        for queue in live_queues(conn)
        for _, headers in messages(conn, queue)
        if headers.get("job_id")
    }
