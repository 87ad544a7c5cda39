"""`factory serve`: the ASGI app. The console at /, the API at /api/v1, media at /media,
/healthz for probes (the only thing served without a token). Outside the routes, outermost
first: the security headers, forwarded addresses from the listed proxies only, and the guard
(factory/web/guard.py: who is asking and body caps, before any route)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException as StarletteHTTPException
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from factory import __version__
from factory.access import Access
from factory.config import Settings
from factory.errors import BadInput, FactoryError, InvalidOperation, ManifestError, NoSuchJob
from factory.job import Job
from factory.ops import Dispatcher, Operations
from factory.ops.media import JobFiles
from factory.store import open_store
from factory.web import api, console
from factory.web.auth import NotSignedIn, SignInLimiter, require_api
from factory.web.guard import Guard, SecurityHeaders
from factory.web.live import LiveHub
from factory.web.runner import LocalRunner
from factory.wiring import Factory

HERE = Path(__file__).parent
log = logging.getLogger("factory.web")


def create_app(settings: Settings, *, factory: Factory | None = None) -> FastAPI:
    factory = factory or Factory.open(settings)
    # Embedded (no broker: no workers, no sweeper): what this server accepts (submit, requeue,
    # approve, redo) its own runner runs, one job at a time (factory/web/runner.py).
    runner = None if settings.broker_url else LocalRunner()
    ops = Operations(
        factory, dispatcher=runner.dispatch if runner else _broker_dispatcher(settings)
    )
    if runner is not None:
        runner.start(ops.run_here)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        if runner is not None:
            runner.close()

    app = FastAPI(
        title="Long-video factory",
        version=__version__,
        openapi_url=None,  # served below, to token holders only
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
        redirect_slashes=False,  # its redirect would carry the request's Host header
    )
    app.state.settings = settings
    app.state.factory = factory
    app.state.ops = ops
    app.state.access = Access(factory.database)
    app.state.limiter = SignInLimiter(settings.console.signin_attempts)
    app.state.files = JobFiles(open_store(settings.store_url, settings.s3))
    app.state.runner = runner  # None with a broker
    app.state.live = LiveHub(ops.all_jobs, settings.console.live_every)
    app.state.templates = _templates()
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")
    app.include_router(api.router)
    app.include_router(console.router)
    _outside_the_routes(app, settings)
    _own_routes(app)
    _errors(app)
    return app


def _templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.filters["clock"] = lambda d: d.astimezone().strftime("%a %H:%M") if d else "-"
    templates.env.filters["stamp"] = lambda d: d.astimezone().strftime("%Y-%m-%d %H:%M:%S")
    return templates


def _outside_the_routes(app: FastAPI, settings: Settings) -> None:
    """Added innermost first: the guard, then forwarded addresses, then the headers."""
    app.add_middleware(Guard, access=app.state.access, limiter=app.state.limiter)
    if settings.console.trusted_proxies:
        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=settings.console.trusted_proxies)
    app.add_middleware(SecurityHeaders)


def _own_routes(app: FastAPI) -> None:
    """The schema (to token holders only) and the probe (to anyone)."""

    @app.get("/api/v1/openapi.json", include_in_schema=False)
    def openapi(request: Request) -> dict[str, Any]:
        require_api(request, "viewer")
        return app.openapi()

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, Any]:
        return {"ok": True, "version": __version__}


def _errors(app: FastAPI) -> None:
    def wants_html(request: Request) -> bool:
        return not request.url.path.startswith(("/api/", "/media/"))

    @app.exception_handler(NotSignedIn)
    def not_signed_in(request: Request, exc: NotSignedIn) -> Response:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        from urllib.parse import quote

        return RedirectResponse(f"/signin?next={quote(target)}", status_code=303)

    @app.exception_handler(ManifestError)
    def manifest_error(request: Request, exc: ManifestError) -> Response:
        problems = [{"field": p.path, "message": p.message} for p in exc.problems]
        return JSONResponse({"error": str(exc), "problems": problems}, status_code=422)

    @app.exception_handler(FactoryError)
    def factory_error(request: Request, exc: FactoryError) -> Response:
        status = 500
        if isinstance(exc, NoSuchJob):
            status = 404
        elif isinstance(exc, InvalidOperation):
            status = 409
        elif isinstance(exc, BadInput):
            status = 404 if getattr(exc, "field", None) == "batch" else 422
        body = {"error": str(exc), "field": getattr(exc, "field", None)}
        if wants_html(request) and status != 500:
            return _html_error(request, status, str(exc))
        return JSONResponse(body, status_code=status)

    @app.exception_handler(RequestValidationError)
    def invalid(request: Request, exc: RequestValidationError) -> Response:
        problems = [
            {"field": ".".join(str(p) for p in e["loc"] if p != "body"), "message": e["msg"]}
            for e in exc.errors()
        ]
        return JSONResponse({"error": "invalid request", "problems": problems}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if wants_html(request) and exc.status_code in (403, 404, 409, 429):
            return _html_error(request, exc.status_code, str(exc.detail), exc.headers)
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code,
                            headers=exc.headers)  # fmt: skip


def _html_error(
    request: Request, status: int, message: str, headers: dict[str, str] | None = None
) -> Response:
    templates = request.app.state.templates
    return templates.TemplateResponse(
        request,
        "error.html",
        {"who": None, "csrf": "", "status": status, "message": message},
        status_code=status,
        headers=headers,
    )


def _broker_dispatcher(settings: Settings) -> Dispatcher:
    """With a broker, accepted work goes to the workers; a broker that is away is logged and
    the action stands (the sweeper sends the jobs once it is back), as in the CLI."""
    from tasks.dispatch import BrokerDispatcher  # the server is where factory/ meets tasks/

    def not_sent(found: list[Job], exc: Exception) -> None:
        log.warning(
            "dispatch.broker_away",
            extra={"jobs": [j.job_id for j in found], "error": f"{type(exc).__name__}: {exc}"},
        )

    return BrokerDispatcher(settings, on_outage=not_sent)
