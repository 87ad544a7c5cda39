"""Where alerts go (FACTORY_WEBHOOK_*); read by factory.config, used by factory.infra.alerts."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WebhookSettings:
    url: str | None = None
    token: str | None = None
    attempts: int = 5
    backoff: float = 1.0
    timeout: float = 10.0
