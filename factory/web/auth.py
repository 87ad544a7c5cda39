"""Who is asking: a Bearer token (the API, media) or a console session cookie (pages, media),
decided before routing by factory/web/guard.py and read here; what they may do (the role);
CSRF on every console form; failed tokens slowed per client address."""

from __future__ import annotations

import ipaddress
import math
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import HTTPException, Request
from starlette.types import Scope

from factory.access import Principal, Session

SESSION_COOKIE = "factory_session"
SIGNIN_COOKIE = "factory_signin"  # the sign-in form's own CSRF secret (double submit)
WINDOW_SECONDS = 60.0
MAX_CLIENTS = 100_000  # addresses remembered at most (the oldest are forgotten first)
CALLER = "factory.caller"  # where the guard leaves the Caller in the request's scope
LIMITED_FOR = "factory.limited_for"  # set by the guard: this sign-in must wait (seconds)


class NotSignedIn(Exception):
    """A console page asked for without a session: answered with a redirect to sign in."""


class SignInLimiter:
    """At most ``attempts`` failed sign-ins (or bad tokens) per client address per minute;
    after that the address's failures wait (429 with Retry-After) until the oldest is a minute
    old. A valid token is never asked: the guard and the sign-in check it first. Entries older
    than the window are pruned at the next use after a window has passed."""

    def __init__(self, attempts: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.attempts = attempts
        self.clock = clock
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()
        self._pruned = clock()

    def __len__(self) -> int:
        return len(self._failures)

    def wait(self, client: str) -> float:
        with self._lock:
            now = self._prune()
            recent = self._failures.get(_bucket(client), ())
            if len(recent) < self.attempts:
                return 0.0
            return max(0.0, recent[0] + WINDOW_SECONDS - now)

    def failed(self, client: str) -> None:
        with self._lock:
            now = self._prune()
            key = _bucket(client)
            recent = self._failures.pop(key, None) or deque(maxlen=self.attempts)
            recent.append(now)
            self._failures[key] = recent  # re-inserted: the dict stays oldest-first
            while len(self._failures) > MAX_CLIENTS:
                del self._failures[next(iter(self._failures))]

    def _prune(self) -> float:
        now = self.clock()
        if now - self._pruned >= WINDOW_SECONDS:
            self._pruned = now
            old = [k for k, v in self._failures.items() if v[-1] <= now - WINDOW_SECONDS]
            for key in old:
                del self._failures[key]
        return now


def _bucket(client: str) -> str:
    """IPv6 clients by their /64 (one host holds a whole /64 to rotate through)."""
    try:
        address = ipaddress.ip_address(client)
    except ValueError:
        return client
    if address.version == 6:
        mapped = address.ipv4_mapped
        return str(mapped) if mapped else str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


@dataclass(frozen=True)
class Caller:
    principal: Principal
    session: Session | None  # None: a Bearer token (no CSRF: no cookie is involved)


def client_address(scope: Scope) -> str:
    """The connecting address; a forwarded one only from FACTORY_CONSOLE_TRUSTED_PROXIES
    (uvicorn's ProxyHeadersMiddleware, added by create_app when the operator lists any)."""
    client = scope.get("client")
    return client[0] if client else "unknown"


def client_of(request: Request) -> str:
    return client_address(request.scope)


def refuse_if_limited(request: Request, limiter: SignInLimiter) -> None:
    """A sign-in from an address with too many failures, and no valid token (the guard
    decided: it read the form before routing)."""
    wait = request.scope.get(LIMITED_FOR, 0.0)
    if wait > 0:
        raise HTTPException(
            429,
            f"too many failed sign-ins from this address; try again in {math.ceil(wait)} s",
            headers={"Retry-After": str(math.ceil(wait))},
        )


def caller(request: Request) -> Caller | None:
    """Who the guard found: a Bearer token under /api/, the session on pages, either on
    media; None on the anonymous paths (/healthz, /signin, /static)."""
    return request.scope.get(CALLER)


def require_api(request: Request, role: str) -> Caller:
    """The API: a Bearer token (or the console's session, for the media the pages embed)."""
    found = caller(request)
    if found is None:
        raise HTTPException(
            401, "send Authorization: Bearer TOKEN", headers={"WWW-Authenticate": "Bearer"}
        )
    return _with_role(found, role)


def require_page(request: Request, role: str) -> Caller:
    found = caller(request)
    if found is None or found.session is None:
        raise NotSignedIn()
    return _with_role(found, role)


def check_csrf(found: Caller, sent: str | None) -> None:
    """Every form post from the console carries the session's CSRF secret."""
    if found.session is None or not found.session.csrf_ok(sent):
        raise HTTPException(403, "the form is stale or was not sent by the console; reload it")


def _with_role(found: Caller, role: str) -> Caller:
    if not found.principal.can(role):
        raise HTTPException(
            403, f"token {found.principal.name} is a {found.principal.role}; this needs {role}"
        )
    return found


def new_signin_secret() -> str:
    return secrets.token_urlsafe(24)


def secure_cookies(request: Request) -> bool:
    mode = request.app.state.settings.console.secure_cookies
    return mode == "always" or (mode == "auto" and request.url.scheme == "https")
