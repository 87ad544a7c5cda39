"""The console's pages, rendered on the server (Jinja2, autoescaped: a prompt or id holding
markup shows as text): sign-in, batches, a batch's grid (live), a video's page with players,
seams, pictures, checks, events and the actions. Every form carries the CSRF secret."""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse

from factory.access import Access
from factory.errors import BadInput, FactoryError
from factory.forecast import parse_window
from factory.ops import Operations
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
from factory.web.media import media_for

router = APIRouter()


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
    view = ops.batch(batch, with_eta=False)
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
def job_page(request: Request, job_id: str, done: str = "", error: str = "",
             status_code: int = 200) -> Response:  # fmt: skip
    found = require_page(request, "viewer")
    ops = _ops(request)
    view = ops.job_view(job_id, with_checks=True)
    job = view.job
    video = job.video
    events = ops.events(job_id)
    players = [r for r in video.renditions if media_for(job, f"{r}.mp4")]
    pictures = [p for p in ("contact", "quality") if media_for(job, f"{p}.png")]
    seams = [s | {"left": round(100 * s.get("seconds", 0) / max(video.duration, 1e-6), 2)}
             for s in view.seams]  # fmt: skip
    return _page(
        request, "job.html", found, status=status_code, job=job, video=video, view=view,
        players=players, pictures=pictures, seams=seams, events=events[-200:],
        requeue_targets=[s.value for s in REQUEUE_TARGETS], done=done, error=error,
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
            new_prompt = prompt.strip() or None
            seed = None if new_prompt else secrets.randbits(31)
            ops.redo(job_id, range_text=range_text, actor=actor, seed=seed, prompt=new_prompt,
                     reason=reason)  # fmt: skip
        else:
            raise HTTPException(404, f"no action {action!r}")
    except (BadInput, ValueError) as exc:
        return job_page(request, job_id, error=str(exc), status_code=409)
    except FactoryError as exc:
        return job_page(request, job_id, error=str(exc), status_code=500)
    return RedirectResponse(f"/jobs/{quote(job_id)}?done={action}", status_code=303)


# --- helpers ---------------------------------------------------------------------------------


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
