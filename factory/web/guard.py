"""Before any route sees a request: no write from another site, who is asking (a Bearer token
for the API, the session cookie for pages, either for media), and no body past its cap read by
anything. Then, while an answer is being sent, its token or session is checked again every few
seconds and the answer ends when it is revoked or expired; a token or session holds at most
MAX_STREAMS live streams. Pure ASGI: an anonymous caller is answered before any handler or
model parses a byte, so it learns nothing of the routes' schemas (docs/console.md)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import parse_qs, quote, urlsplit

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from factory.access import Access
from factory.web.auth import (
    CALLER,
    LIMITED_FOR,
    SESSION_COOKIE,
    Caller,
    SignInLimiter,
    client_address,
)

BODY_LIMIT = 64 * 1024
MANIFEST_LIMIT = 1 << 20  # POST /api/v1/manifests
RECHECK_SECONDS = 4.0  # an answer still being sent re-checks its credential this often
MAX_STREAMS = 8  # open live streams per session or token
SAFE = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(frozen=True)
class Credential:
    bearer: bool  # else a session cookie
    secret: str

    @property
    def key(self) -> str:
        return hashlib.sha256(self.secret.encode()).hexdigest()


class _TooManyStreams(Exception):
    pass


class _Gone(Exception):
    """The client went away while its body was being read."""


class Guard:
    def __init__(self, app: ASGIApp, *, access: Access, limiter: SignInLimiter) -> None:
        self.app = app
        self.access = access
        self.limiter = limiter
        self.streams: dict[str, int] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        path, method = scope["path"], scope["method"]
        if method not in SAFE and cross_site(headers):
            await _json(send, 403, "a write from another site is refused (Origin, Sec-Fetch-Site)")
            return
        credential = None
        if not _open(path):
            found = await self._authenticate(scope, headers)
            if not isinstance(found, tuple):
                await found(send)
                return
            scope[CALLER], credential = found
        limit = MANIFEST_LIMIT if path == "/api/v1/manifests" else BODY_LIMIT
        if _has_body(headers):
            try:
                body = await _read(headers, receive, limit)
            except _Gone:
                return
            if body is None:
                await _json(send, 413, f"the body is larger than {limit // 1024} KiB")
                return
            if path == "/signin" and method == "POST":
                await self._signin_limit(scope, body)
            receive = _replay(body, receive)  # what was read, even nothing, is handed on
        if credential is None:
            await self.app(scope, receive, send)
        else:
            await self._watched(scope, receive, send, credential)

    async def _authenticate(
        self, scope: Scope, headers: Headers
    ) -> tuple[Caller, Credential] | Callable[[Send], Awaitable[None]]:
        path = scope["path"]
        api, media = path.startswith("/api/"), path.startswith("/media/")
        header = headers.get("authorization")
        if (api or media) and header:
            scheme, _, secret = header.partition(" ")
            secret = secret.strip() if scheme.lower() == "bearer" else ""
            principal = await run_in_threadpool(self.access.verify, secret)
            if principal is not None:  # a valid token: never refused by the limiter
                return Caller(principal, None), Credential(True, secret)
            client = client_address(scope)
            wait = self.limiter.wait(client)
            if wait > 0:
                seconds = str(math.ceil(wait))
                message = f"too many failed tokens from this address; try again in {seconds} s"
                return lambda send: _json(send, 429, message, {"Retry-After": seconds})
            self.limiter.failed(client)
            return lambda send: _json(send, 401, "the token is unknown or revoked", BEARER)
        if not api:
            cookie = cookie_parser(headers.get("cookie", "")).get(SESSION_COOKIE)
            session = await run_in_threadpool(self.access.session, cookie) if cookie else None
            if session is not None:
                return Caller(session.principal, session), Credential(False, cookie or "")
        if api or media:
            return lambda send: _json(send, 401, "send Authorization: Bearer TOKEN", BEARER)
        query = scope.get("query_string", b"").decode("latin-1")
        target = quote(path + (f"?{query}" if query else ""))
        return lambda send: _answer(send, 303, b"", {"Location": f"/signin?next={target}"})

    async def _signin_limit(self, scope: Scope, body: bytes) -> None:
        """A limited address still signs in with a valid token; the sign-in handler refuses
        the rest (auth.refuse_if_limited reads what is decided here)."""
        client = client_address(scope)
        wait = self.limiter.wait(client)
        if wait <= 0:
            return
        token = parse_qs(body.decode("utf-8", "replace")).get("token", [""])[0].strip()
        if await run_in_threadpool(self.access.verify, token) is None:
            scope[LIMITED_FOR] = wait

    async def _watched(self, scope: Scope, receive: Receive, send: Send, cred: Credential) -> None:
        """Run the app; while its answer is being sent, re-check the credential and end the
        answer when it is no longer valid; count live streams."""
        sent = {"started": False, "finished": False, "ended": False}
        counted: list[str] = []

        async def tracked(message: Message) -> None:
            if message["type"] == "http.response.start":
                if _is_stream(message):
                    if self.streams.get(cred.key, 0) >= MAX_STREAMS:
                        raise _TooManyStreams()
                    self.streams[cred.key] = self.streams.get(cred.key, 0) + 1
                    counted.append(cred.key)
                sent["started"] = True
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                sent["finished"] = True
            await send(message)

        inner = asyncio.create_task(self.app(scope, receive, tracked))
        watcher = asyncio.create_task(self._recheck(cred, inner, sent))
        try:
            try:
                await asyncio.wait({inner})
            except asyncio.CancelledError:
                inner.cancel()
                raise
            if inner.cancelled() and not sent["ended"]:
                raise asyncio.CancelledError()
            if not inner.cancelled():
                try:
                    inner.result()
                except _TooManyStreams:
                    await _json(send, 429, f"at most {MAX_STREAMS} live pages per sign-in")
                    return
        finally:
            watcher.cancel()
            for key in counted:
                self.streams[key] -= 1
                if not self.streams[key]:
                    del self.streams[key]
        if sent["ended"] and sent["started"] and not sent["finished"]:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        elif sent["ended"] and not sent["started"]:
            await _json(send, 401, "the token or session was revoked or has expired")

    async def _recheck(self, cred: Credential, inner: asyncio.Task[None], sent: dict) -> None:
        while True:
            await asyncio.sleep(RECHECK_SECONDS)
            try:
                valid = await run_in_threadpool(self._valid, cred)
            except Exception:  # cannot tell: end it (a live page reconnects and signs in again)
                valid = False
            if not valid:
                sent["ended"] = True
                inner.cancel()
                return

    def _valid(self, cred: Credential) -> bool:
        if cred.bearer:
            return self.access.verify(cred.secret) is not None
        return self.access.session(cred.secret) is not None


BEARER = {"WWW-Authenticate": "Bearer"}


def cross_site(headers: Headers) -> bool:
    """A browser's request from another site (or a sibling one). Browsers send Sec-Fetch-Site
    on every request; older ones send Origin on a cross-origin POST; other clients send
    neither (and the API needs their token anyway)."""
    site = headers.get("sec-fetch-site")
    if site is not None:
        return site not in ("same-origin", "none")
    origin = headers.get("origin")
    if origin is None:
        return False
    if origin == "null":
        return True
    return urlsplit(origin).netloc.lower() != headers.get("host", "").lower()


def _open(path: str) -> bool:
    return path in ("/healthz", "/signin") or path.startswith("/static/")


def _is_stream(message: Message) -> bool:
    for name, value in message.get("headers", []):
        if name.lower() == b"content-type" and value.startswith(b"text/event-stream"):
            return True
    return False


def _has_body(headers: Headers) -> bool:
    return "content-length" in headers or "transfer-encoding" in headers


async def _read(headers: Headers, receive: Receive, limit: int) -> bytes | None:
    """The body, or None when it is larger than ``limit`` (by Content-Length at once, else
    counted as it arrives: what is past the cap is never read)."""
    length = headers.get("content-length")
    if length is not None and (not length.isdigit() or len(length) > 19 or int(length) > limit):
        return None
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Gone()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay


async def _json(send: Send, status: int, error: str, headers: dict[str, str] | None = None) -> None:
    body = json.dumps({"error": error}).encode()
    await _answer(send, status, body, {"Content-Type": "application/json", **(headers or {})})


async def _answer(send: Send, status: int, body: bytes, headers: dict[str, str]) -> None:
    raw = [(k.lower().encode(), v.encode("latin-1")) for k, v in headers.items()]
    raw.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


CSP = (
    "default-src 'self'; img-src 'self' data:; media-src 'self'; style-src 'self'; "
    "script-src 'self'; frame-ancestors 'none'; form-action 'self'"
)


class SecurityHeaders:
    """Every answer (the guard's refusals and error pages too): the CSP, no framing, no
    sniffing, no referrer to other sites, Server-Timing (bench/console.py reads it), and
    no-store unless the route chose (media, thumbnails, static files); the API is never
    cached (a new token's secret is in an answer)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        api = scope["path"].startswith("/api/")

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                spent = (time.perf_counter() - started) * 1000
                raw = [(k, v) for k, v in message.get("headers", []) if k.lower() not in OWN]
                chosen = any(k.lower() == b"cache-control" for k, _ in raw)
                if api or not (chosen or scope["path"].startswith("/static/")):
                    raw = [(k, v) for k, v in raw if k.lower() != b"cache-control"]
                    raw.append((b"cache-control", b"no-store"))
                raw += [
                    (b"server-timing", f"app;dur={spent:.2f}".encode()),
                    (b"x-frame-options", b"DENY"),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"same-origin"),
                    (b"content-security-policy", CSP.encode()),
                ]
                message = {**message, "headers": raw}
            await send(message)

        await self.app(scope, receive, with_headers)


OWN = frozenset(
    {b"server-timing", b"x-frame-options", b"x-content-type-options", b"referrer-policy",
     b"content-security-policy"}
)  # fmt: skip
