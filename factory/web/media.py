"""A job's media over HTTP with Range (seeking in the browser): its renditions, contact sheet,
quality plot and a thumbnail, from the file store or from S3 through the server's own
mutual-TLS client. The URL names a job and a kind of file, never a path: the key is derived
from the job's own record, so nothing outside the job's keys can be asked for."""

from __future__ import annotations

import io
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.responses import StreamingResponse

from factory.errors import BadInput
from factory.job import Job
from factory.media.presets import PRESETS
from factory.pipeline import files
from factory.stages import Stage
from factory.store import keys
from factory.store.base import Store
from factory.web.auth import require_api

# One range; more than 19 digits (past 2**63) is no file's offset: ignored, never parsed.
_RANGE = re.compile(r"^bytes=(\d{0,19})-(\d{0,19})$", re.IGNORECASE | re.ASCII)
_SEAM = re.compile(r"^seam-(\d{1,6})\.png$", re.ASCII)
PICTURES = ("contact", "quality")
TYPES = {".mp4": "video/mp4", ".png": "image/png"}


@dataclass(frozen=True)
class Media:
    key: str
    content_type: str


def media_for(job: Job, name: str) -> Media | None:
    """The store key of `name` for this job, or None if it has no such file (yet)."""
    video = job.video
    progress = job.progress
    version = job.version  # the published version (its files are all there: deliver.py)
    if name.endswith(".mp4") and name[:-4] in video.renditions:
        rendition = name[:-4]
        muxed = progress.get("mux", {}).get("muxed", {})
        if job.stage is not Stage.DONE and rendition in muxed:
            return Media(files.muxed(job, rendition), TYPES[".mp4"])  # what is being checked
        if version is not None:
            key = keys.output(video.batch, video.video_id, rendition, version)
            return Media(key, TYPES[".mp4"])
        return None
    if name.endswith(".png") and name[:-4] in PICTURES:
        picture = name[:-4]
        if job.stage is not Stage.DONE and progress.get("qc", {}).get("pictures", {}).get(picture):
            return Media(files.qc_picture(job, picture), TYPES[".png"])
        if version is not None:
            prefix = keys.delivery_prefix(video.batch, video.video_id, version)
            return Media(f"{prefix}/{name}", TYPES[".png"])
        return None
    return None


class Thumbnails:
    """The first frame of each video (from its lossless segment 0), small, made once and kept
    in memory (a few KB each)."""

    def __init__(self, store: Store, size: int = 512, width: int = 320) -> None:
        self.store = store
        self.size = size
        self.width = width
        self._made: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, job: Job, attempt: int | None) -> bytes | None:
        key = keys.segment(job.batch, job.video_id, 0, attempt)
        with self._lock:
            if key in self._made:
                self._made.move_to_end(key)
                return self._made[key]
        from PIL import Image

        from factory.media.frames import frames_at

        try:
            with self.store.local_path(key) as path:
                frame = frames_at(path, [0]).get(0)
        except (OSError, ValueError, BadInput):
            return None
        if frame is None:
            return None
        picture = Image.fromarray(frame)
        height = max(1, round(picture.height * self.width / picture.width))
        out = io.BytesIO()
        picture.resize((self.width, height)).save(out, format="PNG")
        data = out.getvalue()
        with self._lock:
            self._made[key] = data
            while len(self._made) > self.size:
                self._made.popitem(last=False)
        return data


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
        data = request.app.state.thumbnails.get(job, first.attempt) if first else None
        if data is None:
            raise HTTPException(404, "no picture of this video yet")
        return _picture(request, data, "private, max-age=300")
    seam = _SEAM.match(name)
    if seam is not None:
        data = _seam_picture(request, job, int(seam.group(1)))
        if data is None:
            raise HTTPException(404, "no picture of that seam")
        return _picture(request, data, "private, max-age=60")
    found = media_for(job, name)
    if found is None:
        raise HTTPException(404, "this job has no such file")
    return ranged(request, request.app.state.store, found)


def _picture(request: Request, data: bytes, cache: str) -> Response:
    headers = {"Cache-Control": cache, "Content-Length": str(len(data))}
    body = b"" if request.method == "HEAD" else data
    return Response(body, media_type="image/png", headers=headers)


def _seam_picture(request: Request, job: Job, seam: int) -> bytes | None:
    """The seam's two frames, cut from the contact sheet (its rows: the seams in order)."""
    sheet = media_for(job, "contact.png")
    order = [s["seam"] for s in request.app.state.ops.job_view(job.job_id).seams]
    if sheet is None or seam not in order:
        return None
    state = request.app.state
    if not hasattr(state, "seam_pictures"):
        state.seam_pictures = SeamPictures(state.store)
    return state.seam_pictures.get(sheet.key, order.index(seam), len(order))


class SeamPictures:
    """Rows cut from contact sheets, kept in memory (a few KB each): a page of 47 seams asks
    for 47 of them, and the sheet is read and decoded once for all."""

    def __init__(self, store: Store, size: int = 2048) -> None:
        self.store = store
        self.size = size
        self._cut: OrderedDict[tuple[str, int, int], bytes | None] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str, row: int, rows: int) -> bytes | None:
        with self._lock:
            if (key, row, rows) in self._cut:
                self._cut.move_to_end((key, row, rows))
                return self._cut[(key, row, rows)]
        from factory.qc.pictures import sheet_frames

        info = self.store.stat(key)
        if info is None:
            return None
        sheet = b"".join(self.store.read_range(key, 0, info.size - 1))
        cut = {(key, r, rows): sheet_frames(sheet, r, rows) for r in range(rows)}
        with self._lock:
            self._cut.update(cut)
            while len(self._cut) > self.size:
                self._cut.popitem(last=False)
        return cut[(key, row, rows)]


def codecs_of(rendition: str) -> str | None:
    """The rendition's MIME type with its RFC 6381 codecs (what `canPlayType` is asked), from
    its preset: `hvc1.P.C.Lnn.B0` for HEVC (level x 30), `avc1.PPCCLL` for H.264; AAC-LC audio."""
    preset = PRESETS.get(rendition)
    if preset is None:
        return None
    level = float(preset.level)
    if preset.is_hevc:
        profile, compat = (2, 4) if preset.profile == "main10" else (1, 6)
        video = f"hvc1.{profile}.{compat}.L{round(level * 30)}.B0"
    else:
        video = f"avc1.{_AVC_PROFILES[preset.profile]}00{round(level * 10):02X}"
    return f'video/mp4; codecs="{video}, mp4a.40.2"'


_AVC_PROFILES = {"baseline": "42", "main": "4D", "high": "64"}


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


def ranged(request: Request, store: Store, media: Media) -> Response:
    """The object, whole (200) or the one range asked for (206); 416 past its end. HEAD: the
    same headers, no body."""
    info = store.stat(media.key)
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
        store.read_range(media.key, start, end),
        status_code=status,
        media_type=media.content_type,
        headers=headers,
    )
