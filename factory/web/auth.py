"""Who is asking: a Bearer token (the API) or a console session cookie; what they may do (the
role); CSRF on every console form; failed sign-ins slowed per client."""

from __future__ import annotations

import math
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass

from fastapi import HTTPException, Request

from factory.access import Access, Principal, Session

SESSION_COOKIE = "factory_session"
SIGNIN_COOKIE = "factory_signin"  # the sign-in form's own CSRF secret (double submit)
WINDOW_SECONDS = 60.0


class NotSignedIn(Exception):
    """A console page asked for without a session: answered with a redirect to sign in."""


class SignInLimiter:
    """At most ``attempts`` failed sign-ins (or bad tokens) per client per minute; after that
    the client waits (429 with Retry-After) until the oldest failure is a minute old."""

    def __init__(self, attempts: int, clock: type[time] | None = None) -> None:
        self.attempts = attempts
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def wait(self, client: str) -> float:
        with self._lock:
            recent = self._recent(client)
            if len(recent) < self.attempts:
                return 0.0
            return max(0.0, recent[0] + WINDOW_SECONDS - time.monotonic())

    def failed(self, client: str) -> None:
        with self._lock:
            self._recent(client).append(time.monotonic())
            if len(self._failures) > 10_000:  # a flood of addresses: forget the quiet ones
                for key in [k for k, v in self._failures.items() if not v][:5000]:
                    del self._failures[key]

    def _recent(self, client: str) -> deque[float]:
        recent = self._failures.setdefault(client, deque())
        while recent and recent[0] < time.monotonic() - WINDOW_SECONDS:
            recent.popleft()
        return recent


@dataclass(frozen=True)
class Caller:
    principal: Principal
    session: Session | None  # None: a Bearer token (no CSRF: no cookie is involved)


def client_of(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def refuse_if_limited(request: Request, limiter: SignInLimiter) -> None:
    wait = limiter.wait(client_of(request))
    if wait > 0:
        raise HTTPException(
            429,
            f"too many failed sign-ins from this address; try again in {math.ceil(wait)} s",
            headers={"Retry-After": str(math.ceil(wait))},
        )


def caller(request: Request, *, allow_cookie: bool, allow_bearer: bool) -> Caller | None:
    access: Access = request.app.state.access
    limiter: SignInLimiter = request.app.state.limiter
    header = request.headers.get("authorization", "")
    if allow_bearer and header:
        refuse_if_limited(request, limiter)
        scheme, _, secret = header.partition(" ")
        principal = access.verify(secret.strip()) if scheme.lower() == "bearer" else None
        if principal is None:
            limiter.failed(client_of(request))
            raise HTTPException(
                401, "the token is unknown or revoked", headers={"WWW-Authenticate": "Bearer"}
            )
        return Caller(principal, None)
    if allow_cookie:
        session = access.session(request.cookies.get(SESSION_COOKIE))
        if session is not None:
            return Caller(session.principal, session)
    return None


def require_api(request: Request, role: str) -> Caller:
    """The API: a Bearer token (or the console's session, for the media the pages embed)."""
    found = caller(request, allow_cookie=True, allow_bearer=True)
    if found is None:
        raise HTTPException(
            401, "send Authorization: Bearer TOKEN", headers={"WWW-Authenticate": "Bearer"}
        )
    return _with_role(found, role)


def require_page(request: Request, role: str) -> Caller:
    found = caller(request, allow_cookie=True, allow_bearer=False)
    if found is None:
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
