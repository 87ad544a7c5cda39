"""A job's files as people look at them (the console's players and pictures, the API's
media): which store key holds a job's rendition, contact sheet or quality plot, a thumbnail
of its first frame, one seam's two frames cut from the contact sheet, and how a browser is
told what a rendition is. The interfaces serve the bytes; the rules are here."""

from __future__ import annotations

import io
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from factory.errors import BadInput
from factory.job import Job, SegmentRecord
from factory.media.presets import PRESETS
from factory.pipeline import files
from factory.plan.video import joins, shown_seams, video_plan
from factory.stages import Stage
from factory.store import keys
from factory.store.base import ObjectInfo, Store

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


class JobFiles:
    """What the interfaces ask of a job's files, over the store they were written to."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._thumbnails = Thumbnails(store)
        self._seam_pictures = SeamPictures(store)

    def find(self, job: Job, name: str) -> Media | None:
        return media_for(job, name)

    def stat(self, key: str) -> ObjectInfo | None:
        return self.store.stat(key)

    def read(self, key: str, first: int, last: int) -> Iterator[bytes]:
        return self.store.read_range(key, first, last)

    def players(self, job: Job) -> list[dict[str, str]]:
        """The renditions there are to play, each with its MIME type and codecs and, where a
        browser cannot play it (HEVC, mostly), an H.264 rendition of the job to offer instead."""
        names = [r for r in job.video.renditions if media_for(job, f"{r}.mp4")]
        h264 = [r for r in names if r in PRESETS and not PRESETS[r].is_hevc]
        return [{"name": r, "type": codecs_of(r) or "",
                 "fallback": next((p for p in h264 if p != r), "")} for r in names]  # fmt: skip

    def pictures(self, job: Job) -> list[str]:
        return [p for p in PICTURES if media_for(job, f"{p}.png")]

    def thumbnail(self, job: Job, first: SegmentRecord) -> bytes | None:
        """The video's first frame, small (PNG), from segment 0 as its record names it."""
        return self._thumbnails.get(job, first.attempt, first.holder)

    def seam_picture(self, job: Job, seams: list[dict[str, Any]], seam: int) -> bytes | None:
        """The seam's two frames, cut from the contact sheet (its rows: factory/plan/video.py,
        `shown_seams`)."""
        sheet = media_for(job, "contact.png")
        plans = video_plan(job.video)
        shown = shown_seams(plans)
        order = [s["seam"] for s in seams if s["seam"] in shown]
        if sheet is None or seam not in order:
            return None
        return self._seam_pictures.get(sheet.key, order.index(seam), len(order) + len(joins(plans)))


class Thumbnails:
    """The first frame of each video (from its lossless segment 0), small, made once and kept
    in memory (a few KB each)."""

    def __init__(self, store: Store, size: int = 512, width: int = 320) -> None:
        self.store = store
        self.size = size
        self.width = width
        self._made: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, job: Job, attempt: int | None, holder: str | None = None) -> bytes | None:
        key = keys.segment(job.batch, job.video_id, 0, attempt, holder)
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
