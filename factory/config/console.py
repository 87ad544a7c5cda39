"""The operations console and HTTP API (`factory serve`, FACTORY_CONSOLE_*, FACTORY_REVIEW),
used by factory.web (docs/console.md)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass

from factory.config.values import read_number
from factory.errors import ConfigError

_WINDOW = re.compile(r"([01]?\d|2[0-3]):[0-5]\d-([01]?\d|2[0-3]):[0-5]\d")


@dataclass(frozen=True)
class ConsoleSettings:
    review_required: bool = False  # FACTORY_REVIEW=required: every batch waits for approval
    session_hours: float = 12.0  # a console sign-in lasts this long
    # Secure cookies: `auto` sets the flag when the request came over TLS (the gateway says so
    # in X-Forwarded-Proto, trusted from FACTORY_CONSOLE_TRUSTED_PROXIES only).
    secure_cookies: str = "auto"
    # Addresses and networks whose X-Forwarded-For/-Proto are believed: none unless listed
    # (loopback included: anyone on the host could forge them).
    trusted_proxies: str = ""
    signin_attempts: int = 5  # failed sign-ins per client per minute before a wait
    live_every: float = 1.0  # seconds between the shared reads behind live pages
    page_size: int = 100  # jobs per page (API default, the batch grid)
    gpus: int = 1  # GPUs the batch ETA schedules onto (FACTORY_CONSOLE_GPUS)
    window: str | None = None  # the night's window, HH:MM-HH:MM, that ETAs are shown against


def parse(env: Mapping[str, str]) -> ConsoleSettings:
    review = (env.get("FACTORY_REVIEW") or "none").strip()
    if review not in ("required", "none"):
        raise ConfigError(f"must be required or none, got {review!r}", field="FACTORY_REVIEW")
    secure = (env.get("FACTORY_CONSOLE_SECURE_COOKIES") or "auto").strip()
    if secure not in ("auto", "always", "never"):
        raise ConfigError(
            f"must be auto, always or never, got {secure!r}", field="FACTORY_CONSOLE_SECURE_COOKIES"
        )
    return ConsoleSettings(
        review_required=review == "required",
        session_hours=_number(env, "FACTORY_CONSOLE_SESSION_HOURS", 12.0, low=0.01, high=24 * 30),
        secure_cookies=secure,
        trusted_proxies=_proxies(env),
        signin_attempts=int(_number(env, "FACTORY_CONSOLE_SIGNIN_ATTEMPTS", 5, low=1, high=1000)),
        live_every=_number(env, "FACTORY_CONSOLE_LIVE_EVERY", 1.0, low=0.1, high=60),
        page_size=int(_number(env, "FACTORY_CONSOLE_PAGE_SIZE", 100, low=10, high=1000)),
        gpus=int(_number(env, "FACTORY_CONSOLE_GPUS", 1, low=1, high=10_000)),
        window=_window(env),
    )


def _proxies(env: Mapping[str, str]) -> str:
    name = "FACTORY_CONSOLE_TRUSTED_PROXIES"
    listed = [p.strip() for p in (env.get(name) or "").split(",") if p.strip()]
    for proxy in listed:
        try:
            ipaddress.ip_network(proxy, strict=False)
        except ValueError:
            raise ConfigError(
                f"must list the gateway's addresses or networks (10.0.0.2, 10.1.0.0/16), "
                f"got {proxy!r}",
                field=name,
            ) from None
    return ",".join(listed)


def _window(env: Mapping[str, str]) -> str | None:
    raw = (env.get("FACTORY_CONSOLE_WINDOW") or "").strip()
    if not raw:
        return None
    if not _WINDOW.fullmatch(raw):
        raise ConfigError(f"must be HH:MM-HH:MM, got {raw!r}", field="FACTORY_CONSOLE_WINDOW")
    return raw


def _number(env: Mapping[str, str], name: str, default: float, *, low: float, high: float) -> float:
    value = read_number(env, name, default, float, "a number")
    if not low <= value <= high:  # NaN fails this too
        raise ConfigError(f"must be from {low:g} to {high:g}, got {env[name].strip()}", field=name)
    return value
