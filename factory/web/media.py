"""A job's media over HTTP with Range (seeking in the browser): its renditions, contact sheet,
quality plot and a thumbnail, from the file store or from S3 through the server's own
mutual-TLS client. The URL names a job and a kind of file, never a path: the key is derived
from the job's own record (factory/ops/media.py), so nothing outside the job's keys can be
asked for."""

from __future__ import annotations

import re

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.responses import StreamingResponse

from factory.ops.media import JobFiles, Media
from factory.web.auth import require_api

# One range; more than 19 digits (past 2**63) is no file's offset: ignored, never parsed.
_RANGE = re.compile(r"^bytes=(\d{0,19})-(\d{0,19})$", re.IGNORECASE | re.ASCII)
_SEAM = re.compile(r"^seam-(\d{1,6})\.png$", re.ASCII)


router = APIRouter()


@router.api_route(
    "/media/{job_id}/{name}",
    methods=["GET", "HEAD"],
    summary="A rendition, contact.png, quality.png, thumb.png or seam-N.png",
)
def media(request: Request, job_id: str, name: str) -> Response:
    require_api(request, "viewer")
    ops = request.app.state.ops
    job = ops.job(job_id)
    if name == "thumb.png":
        first = ops.job_view(job_id).segments.get(0)
        data = request.app.state.files.thumbnail(job, first) if first else None
        if data is None:
            raise HTTPException(404, "no picture of this video yet")
        return _picture(request, data, "private, max-age=300")
    seam = _SEAM.match(name)
    if seam is not None:
        seams = ops.job_view(job_id).seams
        data = request.app.state.files.seam_picture(job, seams, int(seam.group(1)))
        if data is None:
            raise HTTPException(404, "no picture of that seam")
        return _picture(request, data, "private, max-age=60")
    found = request.app.state.files.find(job, name)
    if found is None:
        raise HTTPException(404, "this job has no such file")
    return ranged(request, request.app.state.files, found)


def _picture(request: Request, data: bytes, cache: str) -> Response:
    headers = {"Cache-Control": cache, "Content-Length": str(len(data))}
    body = b"" if request.method == "HEAD" else data
    return Response(body, media_type="image/png", headers=headers)


def byte_range(asked: str | None, size: int) -> tuple[int, int] | None:
    """The one range asked for, as (first, last) within `size` bytes; None: send it whole (no
    Range, or one this server ignores as RFC 9110 allows: malformed, several ranges, or a
    number of more than 19 digits). Unsatisfiable: HTTPException 416."""
    match = _RANGE.match(asked.strip()) if asked else None
    if match is None or not (match.group(1) or match.group(2)):
        return None
    first, last = match.groups()
    if first:
        start, end = int(first), min(int(last), size - 1) if last else size - 1
        if last and int(last) < start:
            return None  # invalid, not unsatisfiable: ignored
    else:  # the last N bytes
        start, end = max(0, size - int(last)), size - 1
        if int(last) == 0:
            start = size
    if start >= size:
        raise HTTPException(
            416, "the range is past the end", headers={"Content-Range": f"bytes */{size}"}
        )
    return start, end


def ranged(request: Request, files: JobFiles, media: Media) -> Response:
    """The object, whole (200) or the one range asked for (206); 416 past its end. HEAD: the
    same headers, no body."""
    info = files.stat(media.key)
    if info is None:
        raise HTTPException(404, "that file is not in the store (any more)")
    size = info.size
    headers = {"Accept-Ranges": "bytes", "Cache-Control": "private, max-age=60"}
    start, end, status = 0, size - 1, 200
    asked = byte_range(request.headers.get("range"), size)
    if asked is not None:
        (start, end), status = asked, 206
        headers["Content-Range"] = f"bytes {start}-{end}/{size}"
    headers["Content-Length"] = str(end - start + 1)
    if size == 0 or request.method == "HEAD":
        return Response(status_code=status, media_type=media.content_type, headers=headers)
    return StreamingResponse(
        files.read(media.key, start, end),
        status_code=status,
        media_type=media.content_type,
        headers=headers,
    )
