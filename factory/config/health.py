"""The worker's health and metrics endpoint (FACTORY_HEALTH_*, FACTORY_METRICS_*), used by
tasks/health.py (docs/operations.md, "Health, readiness and metrics")."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from factory.config.values import positive_float, positive_int
from factory.errors import ConfigError

_HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*$")
_TOKEN = re.compile(r"^[\x21-\x7e]{16,}$")  # what fits in a header, long enough to guess at


@dataclass(frozen=True)
class HealthSettings:
    port: int | None = None  # None: no endpoint (`factory worker --health-port P` sets it)
    host: str = "0.0.0.0"  # kubelet probes come from the node, not from localhost
    max_requests: int = 8  # handled at once; beyond that 503 with Retry-After
    timeout: float = 5.0  # seconds a request may take, slow client included
    metrics_cache: float = 5.0  # seconds the jobs-by-stage and queue-depth reads are reused
    metrics_token: str | None = field(default=None, repr=False)  # Bearer token for /metrics


def parse(env: Mapping[str, str]) -> HealthSettings:
    token = env.get("FACTORY_METRICS_TOKEN") or None
    if token is not None and not _TOKEN.match(token):
        # The value itself is never part of the message: errors get printed and logged.
        raise ConfigError(
            "must be at least 16 printable characters without spaces",
            field="FACTORY_METRICS_TOKEN",
        )
    return HealthSettings(
        port=_port(env, "FACTORY_HEALTH_PORT"),
        host=_host(env, "FACTORY_HEALTH_HOST"),
        max_requests=positive_int(env, "FACTORY_HEALTH_MAX_REQUESTS", 8, unit="requests"),
        timeout=positive_float(env, "FACTORY_HEALTH_TIMEOUT", 5.0),
        metrics_cache=positive_float(env, "FACTORY_METRICS_CACHE", 5.0),
        metrics_token=token,
    )


def _port(env: Mapping[str, str], name: str) -> int | None:
    raw = (env.get(name) or "").strip()
    if raw == "":
        return None
    if not raw.isdigit() or int(raw) > 65535:
        raise ConfigError(f"must be a port number from 0 to 65535, got {raw!r}", field=name)
    return int(raw)


def _host(env: Mapping[str, str], name: str) -> str:
    raw = (env.get(name) or "").strip() or HealthSettings.host
    try:
        ipaddress.ip_address(raw)
    except ValueError:
        if not _HOSTNAME.match(raw) or len(raw) > 253:
            raise ConfigError(
                f"must be an IP address (0.0.0.0, 127.0.0.1, ::) or a host name, got {raw!r}",
                field=name,
            ) from None
    return raw
