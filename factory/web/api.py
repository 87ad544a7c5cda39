"""The HTTP API under /api/v1 (schema at /api/v1/openapi.json): batches, jobs, events, submit,
the operator actions and tokens; every call needs `Authorization: Bearer TOKEN`. Errors are
JSON: {"error": message, "field": path} or, for a manifest, {"problems": [{field, message}]}."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from factory.access import Access
from factory.errors import BadInput
from factory.ops import MAX_PROMPT_CHARS, MAX_SEED, Operations, event_dict, job_summary
from factory.stages import REQUEUE_TARGETS, Stage
from factory.web.auth import require_api

router = APIRouter(prefix="/api/v1")
MAX_MANIFEST_BODY = 1 << 20


def _ops(request: Request) -> Operations:
    return request.app.state.ops


def _operator(request: Request) -> tuple[Operations, str]:
    """The operations layer and the acting operator, for an action (403 below operator)."""
    return _ops(request), require_api(request, "operator").principal.actor


class RequeueBody(BaseModel):
    from_stage: Literal[tuple(s.value for s in REQUEUE_TARGETS)] | None = Field(  # type: ignore[valid-type]
        default=None, alias="from", description="Redo this stage and every later one."
    )


class ReasonBody(BaseModel):
    reason: str = Field(default="", max_length=2000)


class Reviewed(BaseModel):
    """What the reviewer saw (the job's `review_candidate`): a decision is refused with 409
    if the job in review is another attempt or would be delivered as another version."""

    attempt: int | None = Field(default=None, ge=0)
    version: int | None = Field(default=None, ge=1)


class RejectBody(Reviewed):
    reason: str = Field(min_length=1, max_length=2000)


class ApproveBody(Reviewed):
    note: str = Field(default="", max_length=2000)


class RedoBody(BaseModel):
    range: str | None = Field(
        default=None,
        max_length=100,
        description="START-END to make again: 1:10-1:20, or 70-80 (seconds)",
    )
    joins: list[Annotated[str, Field(max_length=64)]] = Field(
        default_factory=list,
        max_length=200,
        description="Instead of a range: SCENE=cut or SCENE=TRANSITION:SECONDS per changed "
        "join between shots (2=dissolve:1.5); nothing is generated again",
    )
    images: list[Annotated[str, Field(max_length=1200)]] = Field(
        default_factory=list,
        max_length=50,
        description="Instead of a range: SCENE=ASSET[,as=first-frame|reference] or SCENE=none "
        "per swapped picture (a store key or an allowed s3:// URL); the scene is made again",
    )
    cameras: list[Annotated[str, Field(max_length=1200)]] = Field(
        default_factory=list,
        max_length=50,
        description="Instead of a range: SCENE=ASSET[,strength=S][,fit=stretch|loop] or "
        "SCENE=none per swapped camera move; the scene is made again",
    )
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED,
                             description="This seed; default a new one")  # fmt: skip
    prompt: str | None = Field(default=None, max_length=MAX_PROMPT_CHARS,
                               description="A new prompt")  # fmt: skip
    reason: str = Field(default="", max_length=2000)
    cascade: bool = False
    dry_run: bool = False


class TokenBody(BaseModel):
    name: str
    role: Literal["viewer", "operator", "admin"]


@router.get("/batches", summary="The newest batches with their jobs counted by stage")
def list_batches(request: Request, limit: int = Query(50, ge=1, le=500)) -> dict[str, Any]:
    require_api(request, "viewer")
    return {"items": [b.to_dict() for b in _ops(request).batches(limit=limit)]}


@router.get("/batches/{batch}", summary="One batch, with the forecast's finish if running")
def get_batch(request: Request, batch: str) -> dict[str, Any]:
    require_api(request, "viewer")
    return _ops(request).batch(batch).to_dict()


@router.get("/jobs", summary="Jobs in submission order, a page at a time")
def list_jobs(
    request: Request,
    batch: str | None = None,
    stage: Literal[tuple(s.value for s in Stage)] | None = None,  # type: ignore[valid-type]
    limit: int = Query(100, ge=1, le=1000),
    after: str | None = Query(None, description="The `next` of the previous page."),
) -> dict[str, Any]:
    require_api(request, "viewer")
    page = _ops(request).jobs(
        batch=batch, stage=Stage(stage) if stage else None, limit=limit, after=after
    )
    return {"items": [job_summary(j) for j in page.items], "next": page.next_cursor}


@router.get("/jobs/{job_id}", summary="A job in full: progress, timings, seams, QC, outputs")
def get_job(request: Request, job_id: str) -> dict[str, Any]:
    require_api(request, "viewer")
    return _ops(request).job_view(job_id, with_checks=True).to_dict()


@router.get("/jobs/{job_id}/events", summary="The job's timeline")
def get_events(request: Request, job_id: str) -> dict[str, Any]:
    require_api(request, "viewer")
    return {"items": [event_dict(e) for e in _ops(request).events(job_id)]}


@router.post(
    "/manifests",
    status_code=201,
    summary="Submit a manifest (YAML, or JSON with Content-Type application/json)",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/yaml": {"schema": {"type": "string"}},
                        "application/json": {"schema": {"type": "object"}}},
        }
    },
)  # fmt: skip
async def submit(request: Request, batch: str | None = None) -> JSONResponse:
    found = require_api(request, "operator")
    body = await request.body()
    if len(body) > MAX_MANIFEST_BODY:
        raise BadInput("is larger than 1024 KiB", field="manifest")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput("is not UTF-8 text", field="manifest") from None
    kind = request.headers.get("content-type", "").split(";")[0].strip()
    fmt = "json" if kind == "application/json" else "yaml"
    from starlette.concurrency import run_in_threadpool

    result = await run_in_threadpool(
        _ops(request).submit_text, text, fmt=fmt, actor=found.principal.actor, batch=batch
    )
    created = set(result.created)
    return JSONResponse(
        {
            "jobs": [job_summary(j) | {"created": j.job_id in created} for j in result.jobs],
            "created": len(created),
        },
        status_code=201 if created else 200,
    )


@router.post("/jobs/{job_id}/requeue", summary="Continue, or redo from a stage")
def requeue(
    request: Request, job_id: str, body: RequeueBody = Body(default_factory=RequeueBody)
) -> dict[str, Any]:
    ops, actor = _operator(request)
    start = Stage(body.from_stage) if body.from_stage else None
    return job_summary(ops.requeue(job_id, from_stage=start, actor=actor))


@router.post("/jobs/{job_id}/cancel", summary="Stop a job at its next checkpoint")
def cancel(
    request: Request, job_id: str, body: ReasonBody = Body(default_factory=ReasonBody)
) -> dict[str, Any]:
    ops, actor = _operator(request)
    return job_summary(ops.cancel(job_id, reason=body.reason, actor=actor))


@router.post("/jobs/{job_id}/approve", summary="Publish a job waiting for review")
def approve(
    request: Request, job_id: str, body: ApproveBody = Body(default_factory=ApproveBody)
) -> dict[str, Any]:
    ops, actor = _operator(request)
    return job_summary(ops.approve(job_id, actor=actor, note=body.note, attempt=body.attempt,
                                   version=body.version))  # fmt: skip


@router.post("/jobs/{job_id}/reject", summary="Send a job waiting for review back, with why")
def reject(request: Request, job_id: str, body: RejectBody) -> dict[str, Any]:
    ops, actor = _operator(request)
    return job_summary(ops.reject(job_id, actor=actor, reason=body.reason, attempt=body.attempt,
                                  version=body.version))  # fmt: skip


@router.post("/jobs/{job_id}/redo", summary="Make a time range again as a new version")
def redo(request: Request, job_id: str, body: RedoBody) -> JSONResponse:
    """The plan (`dry_run`: only the plan); then the segments covering the range are made
    again, joined, the changed chunks encoded, QC'd and delivered as the next version. With a
    broker the workers do it; embedded, this server does, in the background (202)."""
    ops, actor = _operator(request)
    if body.dry_run:
        _, plan = ops.redo_plan(job_id, range_text=body.range, cascade=body.cascade,
                                joins=body.joins, images=body.images, cameras=body.cameras,
                                remote=True)  # fmt: skip
        return JSONResponse({"plan": plan.to_dict()})
    plan, job = ops.redo(job_id, range_text=body.range, actor=actor,
                         seed=body.seed, prompt=body.prompt, reason=body.reason,
                         cascade=body.cascade, joins=body.joins, images=body.images,
                         cameras=body.cameras, remote=True)  # fmt: skip
    return JSONResponse({"plan": plan.to_dict(), "job": job_summary(job),
                         "seed": job.progress["redo"]["seed"]}, status_code=202)  # fmt: skip


@router.get("/tokens", summary="Every token (admin)")
def list_tokens(request: Request) -> dict[str, Any]:
    require_api(request, "admin")
    access: Access = request.app.state.access
    return {"items": [t.to_dict() for t in access.list_tokens()]}


@router.post("/tokens", status_code=201, summary="Create a token; its secret is shown once (admin)")
def create_token(request: Request, body: TokenBody) -> dict[str, Any]:
    require_api(request, "admin")
    info, secret = request.app.state.access.create_token(body.name, body.role)
    return info.to_dict() | {"token": secret}


@router.delete("/tokens/{name}", summary="Revoke a token and end its sessions (admin)")
def revoke_token(request: Request, name: str) -> dict[str, Any]:
    require_api(request, "admin")
    return request.app.state.access.revoke(name).to_dict()
