"""Secrets never leave the process in text: logs, errors, job events and reports pass here.

What is masked: passwords in URLs (`redis://:pw@…`, `postgresql://user:p/w@…`), PEM private
keys, SigV4 signatures and credentials (headers and presigned query strings), AWS access key
ids, and the values of the secret environment variables the process was given (AWS secret
key, session token, webhook tokens), wherever they appear.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from typing import Any

MASK = "***"
SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID",
              "FACTORY_WEBHOOK_TOKEN", "FACTORY_METRICS_TOKEN", "MINIO_ROOT_PASSWORD",
              "FACTORY_MINIO_SECRET_KEY", "PGPASSWORD", "REDISCLI_AUTH")  # fmt: skip
# user:password values: the whole value and the password alone are masked
SECRET_PAIR_ENV = ("FACTORY_FLOWER_BASIC_AUTH", "FLOWER_BASIC_AUTH")

_PATTERNS = (
    (
        re.compile(
            r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(-----END [A-Z ]*PRIVATE KEY-----|$)", re.S
        ),
        "-----PRIVATE KEY " + MASK + "-----",
    ),
    # user:password@ in a URL: up to the last '@' of the word, so a password holding '/',
    # ':', '?' or an unescaped '@' is masked whole (masking too much is the safe side)
    (re.compile(r"(?i)([a-z][a-z0-9+.-]*://[^:/@\s]*):([^\s\"']+)@"), r"\1:" + MASK + "@"),
    (
        re.compile(r"(?i)((?:x-amz-)?(?:signature|credential|security-token)=)[^&\s,\"']+"),
        r"\1" + MASK,
    ),
    (
        re.compile(
            r"(?i)(authorization:?\s*\"?\s*)(aws4-hmac-sha256|bearer|basic)\s+[^\s\"']+(?:,\s*[^\s\"']+)*"
        ),
        r"\1\2 " + MASK,
    ),
    (re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"), "AKIA" + MASK),
)
_values: set[str] = set()


def register_secrets(values: Iterable[str | None]) -> None:
    """Values to mask wherever they appear (too short ones would mask ordinary words)."""
    _values.update(v for v in values if v and len(v) >= 6)


def register_environment(environ: dict[str, str] | None = None) -> None:
    env = os.environ if environ is None else environ
    register_secrets(env.get(name) for name in SECRET_ENV)
    for name in SECRET_PAIR_ENV:
        value = env.get(name) or ""
        register_secrets([value, value.partition(":")[2]])


def redact(text: str) -> str:
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    for value in sorted(_values, key=len, reverse=True):
        if value in text:
            text = text.replace(value, MASK)
    return text


def redact_value(value: Any) -> Any:
    """The same for JSON-like data (event details, reports)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redact_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_value(v) for v in value]
    return value


_RECORD_FIELDS = {"msg", "name", "levelname", "pathname", "filename", "module", "funcName"}


class RedactingFilter(logging.Filter):
    """Formats the message once, masks it, and masks string `extra` fields too."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: leave it to the handler to report
            return True
        record.msg, record.args = redact(message), None
        for name, value in list(vars(record).items()):
            if isinstance(value, str) and name not in _RECORD_FIELDS:
                setattr(record, name, redact(value))
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True


register_environment()
