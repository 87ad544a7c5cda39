"""Looking into the Redis broker: which jobs still have a message waiting in a queue.

The sweeper leaves those alone: a job waiting for a free GPU is not stale. Only a message that
can advance the job's current stage, with the job's current attempt, counts. A message in a
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


def advancing(raw: bytes, headers: dict) -> tuple[str, str, int] | None:
    """(job, stage, attempt) of a message that can advance a job's stage: a segment or shot
    message or a CPU stage link that carries its fencing token. A chunk encode cannot, nor can a
    link sent before links carried tokens (it is dropped or superseded all the same)."""
    task = headers.get("task")
    if task not in ("factory.generate_segment", "factory.generate_shot", "factory.cpu_stage"):
        return None
    try:
        args = message_args(raw)
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    if task == "factory.generate_segment" and len(args) == 2:
        return str(args[0]), "generate", int(args[1])
    if task == "factory.generate_shot" and len(args) == 3:  # joins under that attempt
        return str(args[0]), "generate", int(args[1])
    if task == "factory.cpu_stage" and len(args) == 3:
        return str(args[0]), str(args[1]), int(args[2])
    return None


def waiting_shots(broker_url: str) -> dict[tuple[str, int], list[int | None]]:
    """(job, attempt) -> the shot each waiting `generate_shot` message asks for first (None:
    any open one), from the queues someone consumes."""
    conn = client(broker_url)
    found: dict[tuple[str, int], list[int | None]] = {}
    for queue in live_queues(conn):
        for raw, headers in messages(conn, queue):
            if headers.get("task") != "factory.generate_shot":
                continue
            try:
                job_id, attempt, shot = message_args(raw)
            except (ValueError, KeyError, IndexError, TypeError):
                continue
            found.setdefault((str(job_id), int(attempt)), []).append(
                None if shot is None else int(shot)
            )
    return found


def waiting_messages(broker_url: str) -> list[tuple[str, str, int]]:
    """Every waiting message that can advance a job, from the queues someone consumes."""
    conn = client(broker_url)
    found = []
    for queue in live_queues(conn):
        for raw, headers in messages(conn, queue):
            if (key := advancing(raw, headers)) is not None:
                found.append(key)
    return found
