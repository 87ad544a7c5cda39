"""The SQL the operations layer reads batches and pages of jobs with: a progress number out
of the JSON on PostgreSQL and SQLite alike, and the keyset cursor of a page."""

from __future__ import annotations

import base64
import binascii
import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Integer, literal
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

from factory.errors import BadInput
from factory.stages import Stage

PAST_GENERATION = {s.value for s in Stage if s not in (Stage.QUEUED, Stage.GENERATE)} - {
    Stage.FAILED.value,
    Stage.CANCELLED.value,
}


class _ProgressNumber(FunctionElement[int]):
    """A whole number at the top of a job's progress JSON, read in SQL."""

    type = Integer()
    inherit_cache = True


@compiles(_ProgressNumber, "postgresql")
def _progress_number_pg(element: _ProgressNumber, compiler: Any, **kw: Any) -> str:
    (key,) = element.clauses
    return f"((jobs.progress ->> {compiler.process(key, **kw)})::bigint)"


@compiles(_ProgressNumber, "sqlite")
def _progress_number_sqlite(element: _ProgressNumber, compiler: Any, **kw: Any) -> str:
    (key,) = element.clauses
    return f"CAST(json_extract(jobs.progress, '$.' || {compiler.process(key, **kw)}) AS INTEGER)"


def progress_number(key: str) -> Any:
    return _ProgressNumber(literal(key))


def encode_cursor(created: datetime, job_id: str) -> str:
    raw = json.dumps([created.astimezone(UTC).isoformat(), job_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created, job_id = json.loads(raw)
        return datetime.fromisoformat(created), str(job_id)
    except (ValueError, TypeError, binascii.Error):
        raise BadInput("is not a cursor this API gave out", field="after") from None
