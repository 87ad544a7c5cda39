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

from fastapi import HTTPException, Request, Response
from fastapi.responses import StreamingResponse

from factory.db.state import Job
from factory.errors import BadInput
from factory.pipeline import files
from factory.stages import Stage
from factory.store import keys
from factory.store.base import Store

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
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


def ranged(request: Request, store: Store, media: Media) -> Response:
    """The object, whole (200) or the one range asked for (206); 416 past its end."""
    info = store.stat(media.key)
    if info is None:
        raise HTTPException(404, "that file is not in the store (any more)")
    size = info.size
    headers = {"Accept-Ranges": "bytes", "Cache-Control": "private, max-age=60"}
    asked = request.headers.get("range")
    start, end, status = 0, size - 1, 200
    if asked:
        match = _RANGE.match(asked.strip())
        if match is None or (not match.group(1) and not match.group(2)):
            raise HTTPException(
                416, "one range, bytes=START-END", headers={"Content-Range": f"bytes */{size}"}
            )
        first, last = match.groups()
        if first:
            start = int(first)
            end = min(int(last), size - 1) if last else size - 1
        else:  # the last N bytes
            start, end = max(0, size - int(last)), size - 1
        if start >= size or start > end:
            raise HTTPException(
                416, "the range is past the end", headers={"Content-Range": f"bytes */{size}"}
            )
        status = 206
        headers["Content-Range"] = f"bytes {start}-{end}/{size}"
    headers["Content-Length"] = str(end - start + 1)
    if size == 0:
        return Response(b"", status_code=200, media_type=media.content_type, headers=headers)
    return StreamingResponse(
        store.read_range(media.key, start, end),
        status_code=status,
        media_type=media.content_type,
        headers=headers,
    )
