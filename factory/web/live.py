"""Live batch pages without a query per page: one reader per watched batch reads its jobs once
every FACTORY_CONSOLE_LIVE_EVERY seconds and fans what changed out to every open page
(server-sent events). Fifty people watching one batch cost one read a second, not fifty."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.concurrency import run_in_threadpool

from factory.job import Job

Reader = Callable[[str], list[Job]]


def card(job: Job) -> dict[str, Any]:
    """What a grid card shows of a job (the page renders the same at first)."""
    p = job.progress
    total = max(1, p.get("frames_total", 0))
    made = p.get("frame", 0)
    late = job.stage.value not in ("queued", "generate", "failed", "cancelled")
    qc = p.get("qc") or {}
    verdict = "" if not qc else ("passed" if qc.get("passed") else "failed")
    return {
        "job_id": job.job_id,
        "stage": job.stage.value,
        "stopped": job.stopped_stage.value if job.stopped_stage else None,
        "percent": 100 if late else round(100 * made / total),
        "segments": f"{len(p.get('segments', []))}/{p.get('segments_total', 0)}",
        "verdict": verdict,
        "updated_at": job.updated_at.isoformat(),
    }


@dataclass
class _Watch:
    subscribers: set[asyncio.Queue[str]] = field(default_factory=set)
    cards: dict[str, dict[str, Any]] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None


class LiveHub:
    def __init__(self, read: Reader, every: float) -> None:
        self.read = read
        self.every = every
        self.reads = 0  # database reads made (the benchmark counts them)
        self._watches: dict[str, _Watch] = {}

    async def follow(self, batch: str) -> AsyncIterator[str]:
        """Server-sent events for one page: everything at first, then what changed."""
        queue: asyncio.Queue[str] = asyncio.Queue(maxsize=64)
        watch = self._watches.setdefault(batch, _Watch())
        watch.subscribers.add(queue)
        if watch.task is None or watch.task.done():
            watch.task = asyncio.create_task(self._poll(batch, watch))
        elif watch.cards:
            queue.put_nowait(_event(list(watch.cards.values())))
        try:
            yield "retry: 3000\n\n"
            while True:
                try:
                    yield await asyncio.wait_for(queue.get(), timeout=15)
                except TimeoutError:
                    yield ": still here\n\n"  # keeps proxies from closing a quiet stream
        finally:
            watch.subscribers.discard(queue)

    async def _poll(self, batch: str, watch: _Watch) -> None:
        try:
            while watch.subscribers:
                found = await run_in_threadpool(self.read, batch)
                self.reads += 1
                cards = {job.job_id: card(job) for job in found}
                changed = [c for k, c in cards.items() if watch.cards.get(k) != c]
                watch.cards = cards
                if changed:
                    message = _event(changed)
                    for queue in list(watch.subscribers):
                        with contextlib.suppress(asyncio.QueueFull):  # a stalled page: skipped
                            queue.put_nowait(message)
                await asyncio.sleep(self.every)
        finally:
            if not watch.subscribers:
                self._watches.pop(batch, None)


def _event(cards: list[dict[str, Any]]) -> str:
    return f"data: {json.dumps({'jobs': cards})}\n\n"
