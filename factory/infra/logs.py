"""Logging: every line carries the job id and trace id of the work in progress.

`FACTORY_LOG_FORMAT=json` writes one JSON object per line (for log shippers); the default
is plain text. The ids come from context variables that the Celery task wrapper sets from
the message headers, so they follow the job across workers.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from factory.infra.redact import RedactingFilter

trace_id: contextvars.ContextVar[str] = contextvars.ContextVar("trace_id", default="-")
job_id: contextvars.ContextVar[str] = contextvars.ContextVar("job_id", default="-")

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "trace_id", "job_id"}


@contextmanager
def job_context(job: str, trace: str) -> Iterator[None]:
    tokens = job_id.set(job), trace_id.set(trace)
    try:
        yield
    finally:
        job_id.reset(tokens[0])
        trace_id.reset(tokens[1])


class _ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "trace_id") or record.trace_id == "-":
            record.trace_id = trace_id.get()
        if not hasattr(record, "job_id") or record.job_id == "-":
            record.job_id = job_id.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data = {
            "at": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "job_id": getattr(record, "job_id", "-"),
            "trace_id": getattr(record, "trace_id", "-"),
        }
        data.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            data["error"] = record.exc_text or self.formatException(record.exc_info)
        return json.dumps(data, default=str)


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [job=%(job_id)s trace=%(trace_id)s] %(message)s"


class TextFormatter(logging.Formatter):
    """The plain line, then the record's fields (`reason=…`, `error=…`): an operator reading
    a worker's log sees why, not only what."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = {k: v for k, v in vars(record).items() if k not in _STANDARD}
        if fields:
            line += " " + " ".join(f"{k}={_short(v)}" for k, v in fields.items())
        return line


def _short(value: object) -> str:
    text = str(value).replace("\n", " ")
    return json.dumps(text[:300]) if (" " in text or not text) else text[:300]


def configure(fmt: str = "text", level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_ContextFilter())
    handler.addFilter(RedactingFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
