"""The console's pages, rendered on the server (Jinja2, autoescaped: a prompt or id holding
markup shows as text): sign-in, batches, a batch's grid (live), a video's page with players,
seams, pictures, checks, events and the actions. Every form carries the CSRF secret."""

from __future__ import annotations

import hashlib
import hmac
from datetime import datetime
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse

from factory.access import Access
from factory.errors import BadInput, FactoryError, NoSuchJob
from factory.ops import Operations
from factory.ops.forecast import parse_window
from factory.ops.views import material_rows
from factory.stages import REQUEUE_TARGETS, Stage
from factory.web.auth import (
    SESSION_COOKIE,
    SIGNIN_COOKIE,
    Caller,
    check_csrf,
    client_of,
    new_signin_secret,
    refuse_if_limited,
    require_page,
    secure_cookies,
)
from factory.web.live import card
from factory.web.media import router as media_router

router = APIRouter()
router.include_router(media_router)  # the media the pages play (GET and HEAD)

# What a page may say after an action: the redirect names one of these, signed (below).
NOTICES = {
    "approve": "Approved: it is being delivered.",
    "reject": "Sent back.",
    "requeue": "Requeued.",
    "cancel": "Cancelled.",
    "redo": "Redo started: it will be delivered as the next version.",
}


def _ops(request: Request) -> Operations:
    return request.app.state.ops


def _page(request: Request, template: str, found: Caller | None, status: int = 200,
          **context: Any) -> HTMLResponse:  # fmt: skip
    templates = request.app.state.templates
    return templates.TemplateResponse(
        request,
        template,
        {"who": found.principal if found else None,
         "csrf": found.session.csrf if found and found.session else "", **context},
        status_code=status,
        headers={"Cache-Control": "no-store"},
    )  # fmt: skip


# --- signing in ---------------------------------------------------------------------------


@router.get("/signin", response_class=HTMLResponse)
def signin_form(request: Request, next: str = "/") -> Response:
    secret = new_signin_secret()
    response = _page(request, "signin.html", None, next=_local(next), form_secret=secret)
    response.set_cookie(SIGNIN_COOKIE, secret, httponly=True, samesite="strict",
                        secure=secure_cookies(request), max_age=3600)  # fmt: skip
    return response


@router.post("/signin")
def signin(
    request: Request,
    token: str = Form(""),
    csrf: str = Form(""),
    next: str = Form("/"),
) -> Response:
    sent = request.cookies.get(SIGNIN_COOKIE)
    if not sent or not csrf or sent != csrf:
        raise HTTPException(403, "the sign-in form is stale or was not sent by the console")
    limiter = request.app.state.limiter
    refuse_if_limited(request, limiter)
    access: Access = request.app.state.access
    principal = access.verify(token.strip())
    if principal is None:
        limiter.failed(client_of(request))
        secret = new_signin_secret()
        response = _page(request, "signin.html", None, status=401, next=_local(next),
                         form_secret=secret, error="That token is unknown or revoked.")  # fmt: skip
        response.set_cookie(SIGNIN_COOKIE, secret, httponly=True, samesite="strict",
                            secure=secure_cookies(request), max_age=3600)  # fmt: skip
        return response
    hours = request.app.state.settings.console.session_hours
    cookie, _ = access.open_session(principal, hours)
    response = RedirectResponse(_local(next), status_code=303)
    response.set_cookie(SESSION_COOKIE, cookie, httponly=True, samesite="lax",
                        secure=secure_cookies(request), max_age=int(hours * 3600))  # fmt: skip
    response.delete_cookie(SIGNIN_COOKIE)
    return response


@router.post("/signout")
def signout(request: Request, csrf: str = Form("")) -> Response:
    found = require_page(request, "viewer")
    check_csrf(found, csrf)
    request.app.state.access.close_session(request.cookies.get(SESSION_COOKIE))
    response = RedirectResponse("/signin", status_code=303)
    response.delete_cookie(SESSION_COOKIE)
    return response


# --- watching -------------------------------------------------------------------------------


@router.get("/", response_class=HTMLResponse)
def batches_page(request: Request) -> Response:
    found = require_page(request, "viewer")
    ops = _ops(request)
    views = ops.batches(limit=50)
    window = request.app.state.settings.console.window
    rows = []
    for view in views:
        eta = ops.eta(view.batch) if not view.finished else None
        rows.append({"view": view, "eta": eta, "window_end": _window_end(window, view.created_at)})
    return _page(request, "batches.html", found, rows=rows, window=window)


@router.get("/batches/{batch}", response_class=HTMLResponse)
def batch_page(request: Request, batch: str, after: str | None = None) -> Response:
    found = require_page(request, "viewer")
    ops = _ops(request)
    try:
        view = ops.batch(batch, with_eta=False)
    except BadInput as exc:
        if exc.field == "batch":  # the name is the URL's: not said back
            raise HTTPException(404, "there is no such batch") from None
        raise
    page = ops.jobs(batch=batch, limit=request.app.state.settings.console.page_size, after=after)
    cards = [card(j) | {"video_id": j.spec.get("video_id", ""), "prompt": _prompt(j.spec)}
             for j in page.items]  # fmt: skip
    return _page(request, "batch.html", found, view=view, cards=cards, next=page.next_cursor,
                 batch=batch)  # fmt: skip


@router.get("/batches/{batch}/live")
async def batch_live(request: Request, batch: str) -> Response:
    require_page(request, "viewer")
    return StreamingResponse(
        request.app.state.live.follow(batch),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, job_id: str, done: str = "") -> Response:
    found = require_page(request, "viewer")
    return _job_page(request, found, job_id, notice=_notice(found, job_id, done))


def _job_page(request: Request, found: Caller, job_id: str, *, status: int = 200,
              notice: str = "", error: str = "") -> Response:  # fmt: skip
    """The video's page. Everything it says comes from the server: `notice` from NOTICES,
    `error` from a refused action, `status` chosen by the caller here, never the URL."""
    ops = _ops(request)
    try:
        view = ops.job_view(job_id, with_checks=True)
    except NoSuchJob:
        raise HTTPException(404, "there is no such video") from None
    job = view.job
    video = job.video
    events = ops.events(job_id)
    files = request.app.state.files
    players, pictures = files.players(job), files.pictures(job)
    seams = [s | {"left": round(100 * s.get("seconds", 0) / max(video.duration, 1e-6), 2)}
             for s in view.seams]  # fmt: skip
    return _page(
        request, "job.html", found, status=status, job=job, video=video, view=view,
        players=players, pictures=pictures, seams=seams, material=material_rows(video),
        worst=view.worst_seams(ops.settings.qc), events=events[-200:],
        requeue_targets=[s.value for s in REQUEUE_TARGETS], notice=notice, error=error,
        can_act=found.principal.can("operator"), Stage=Stage,
    )  # fmt: skip


# --- acting ----------------------------------------------------------------------------------


@router.post("/jobs/{job_id}/{action}")
def act(
    request: Request,
    job_id: str,
    action: str,
    csrf: str = Form(""),
    reason: str = Form(""),
    from_stage: str = Form(""),
    range_text: str = Form("", alias="range"),
    prompt: str = Form(""),
    attempt: int | None = Form(None),
    version: int | None = Form(None),
) -> Response:
    found = require_page(request, "operator")
    check_csrf(found, csrf)
    if action not in NOTICES:
        raise HTTPException(404, "no such action")
    ops, actor = _ops(request), found.principal.actor
    try:
        if action == "approve":
            ops.approve(job_id, actor=actor, note=reason, attempt=attempt, version=version)
        elif action == "reject":
            ops.reject(job_id, actor=actor, reason=reason, attempt=attempt, version=version)
        elif action == "requeue":
            ops.requeue(job_id, from_stage=Stage(from_stage) if from_stage else None, actor=actor)
        elif action == "cancel":
            ops.cancel(job_id, reason=reason, actor=actor)
        elif action == "redo":
            ops.redo(job_id, range_text=range_text, actor=actor, prompt=prompt.strip() or None,
                     reason=reason)  # fmt: skip
    except NoSuchJob:
        raise HTTPException(404, "there is no such video") from None
    except (BadInput, ValueError) as exc:
        return _job_page(request, found, job_id, error=str(exc), status=409)
    except FactoryError as exc:
        return _job_page(request, found, job_id, error=str(exc), status=500)
    done = f"{action}.{_sign(found, job_id, action)}"
    return RedirectResponse(f"/jobs/{quote(job_id)}?done={done}", status_code=303)


# --- helpers ---------------------------------------------------------------------------------


def _sign(found: Caller, job_id: str, action: str) -> str:
    """A MAC over the job and the action with the session's own secret: a link that says
    "approved" cannot be made by anyone else, nor carried to another job or session."""
    key = found.session.csrf.encode() if found.session else b""
    message = f"notice\0{job_id}\0{action}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()[:20]


def _notice(found: Caller, job_id: str, done: str) -> str:
    action, _, mac = done.partition(".")
    if found.session is None or action not in NOTICES:
        return ""
    signed = hmac.compare_digest(mac.encode(), _sign(found, job_id, action).encode())
    return NOTICES[action] if signed else ""


def _local(target: str) -> str:
    """Only a path on this server (no `//host`, no scheme): sign-in never sends you away."""
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _prompt(spec: dict[str, Any]) -> str:
    scenes = spec.get("scenes") or []
    return str(scenes[0].get("prompt", "")) if scenes else ""


def _window_end(window: str | None, created: datetime) -> datetime | None:
    if not window:
        return None
    return parse_window(window, created.astimezone())[1]
