"""`factory gpu report`: the measured memory and speed table, aggregated from the
`segment.done` events every diffusers segment records (peak allocated and reserved memory,
fragmentation, seconds, attention backend, GPU), plus the prompt-embedding cache's hit rate."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select

from factory.db.models import job_events
from factory.db.session import Database
from factory.generate.embeddings import CacheStats


@dataclass
class Row:
    family: str
    resolution: str
    segment_frames: int
    device: str  # the GPU's name, or "cpu"
    attention: str
    segments: int
    median_seconds: float
    peak_allocated: int | None
    peak_reserved: int | None
    fragmentation: float | None
    peak_rss: int | None
    oom_retries: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def gpu_rows(database: Database, since: datetime | None = None) -> list[Row]:
    query = select(job_events.c.detail).where(job_events.c.event == "segment.done")
    if since is not None:
        query = query.where(job_events.c.at >= since)
    with database.connect() as conn:
        details = [row.detail for row in conn.execute(query)]
    groups: dict[tuple[str, str, int, str, str], list[dict[str, Any]]] = {}
    for detail in details:
        used = detail.get("memory")
        if not used:  # procedural and timed segments measure nothing
            continue
        key = (
            detail.get("family", "?"),
            detail.get("resolution", "?"),
            int(detail.get("segment_frames", 0)),
            used.get("gpu") or used.get("device", "?"),
            detail.get("attention", "?"),
        )
        groups.setdefault(key, []).append(detail)
    rows = []
    for (family, resolution, frames, device, attention), found in sorted(groups.items()):
        used = [d["memory"] for d in found]
        rows.append(
            Row(
                family=family,
                resolution=resolution,
                segment_frames=frames,
                device=device,
                attention=attention,
                segments=len(found),
                median_seconds=round(statistics.median(d["seconds"] for d in found), 3),
                peak_allocated=_max(u.get("peak_allocated") for u in used),
                peak_reserved=_max(u.get("peak_reserved") for u in used),
                fragmentation=_mean(u.get("fragmentation") for u in used),
                peak_rss=_max(u.get("peak_rss") for u in used),
                oom_retries=sum(int(u.get("oom_retries") or 0) for u in used),
            )
        )
    return rows


def cache_summary(stats: CacheStats | None) -> dict[str, Any] | None:
    if stats is None:
        return None
    return {
        "entries": stats.entries,
        "bytes": stats.bytes,
        "capacity": stats.capacity,
        "hits": stats.hits,
        "misses": stats.misses,
        "hit_rate": None if stats.hit_rate is None else round(stats.hit_rate, 4),
    }


def _max(values: Any) -> int | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _mean(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.fmean(present), 4) if present else None
