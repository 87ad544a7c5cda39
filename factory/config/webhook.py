"""Where alerts go (FACTORY_WEBHOOK_*); used by factory.infra.alerts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlparse

from factory.config.values import is_loopback, positive_float, positive_int
from factory.errors import ConfigError
from factory.infra.redact import redact


@dataclass(frozen=True)
class WebhookSettings:
    url: str | None = None
    token: str | None = None
    attempts: int = 5
    backoff: float = 1.0
    timeout: float = 10.0


def parse(env: Mapping[str, str]) -> WebhookSettings:
    url = env.get("FACTORY_WEBHOOK_URL") or None
    if url and not url.startswith("https://"):
        loopback = url.startswith("http://") and is_loopback(urlparse(url).hostname or "")
        if not loopback:  # the token and the alerts would cross the network in clear
            raise ConfigError(
                f"must be an https:// URL (http:// only to this host), got {redact(url)!r}",
                field="FACTORY_WEBHOOK_URL",
            )
    return WebhookSettings(
        url=url,
        token=env.get("FACTORY_WEBHOOK_TOKEN") or None,
        attempts=positive_int(env, "FACTORY_WEBHOOK_ATTEMPTS", 5, unit="attempts"),
        backoff=positive_float(env, "FACTORY_WEBHOOK_BACKOFF", 1.0),
    )
