"""Media from outside, identified by its bytes: the one place that says which reader may open
a sound, a video (a camera move) or a picture that a manifest or a redo brings.

A file's name says nothing (`poly.g722` may hold a DASH manifest, `pan.mp4` an HLS playlist):
each kind has a short list of containers, known by their magic numbers, and a file is opened
only by the demuxer its bytes name (ffmpeg `-f`, PyAV `format=`), with `file` the only
protocol, so no playlist, manifest, concat script, image sequence or network reader ever
runs, and no reference to another file (MP4's data references stay off) is followed. What
the container holds must be one of the kind's codecs. Everything that opens such media,
at submit and on the workers, goes through here (docs/security.md, "Media from outside").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import av

from factory.errors import PermanentError

Kind = Literal["sound", "video", "picture"]

HEAD_BYTES = 64
MAX_ID3_BYTES = 16 << 20  # an ID3 tag (cover art included) before MP3 or FLAC


@dataclass(frozen=True)
class Container:
    name: str  # as people call it, for messages
    demuxer: str  # the one ffmpeg demuxer that may open it (Pillow's format for pictures)


WAV = Container("WAV", "wav")
FLAC = Container("FLAC", "flac")
OGG = Container("Ogg", "ogg")
MP3 = Container("MP3", "mp3")
MP4 = Container("MP4/MOV", "mov")
MATROSKA = Container("Matroska/WebM", "matroska")
PNG = Container("PNG", "PNG")
JPEG = Container("JPEG", "JPEG")
WEBP = Container("WebP", "WEBP")

ACCEPTED: dict[Kind, tuple[Container, ...]] = {
    "sound": (WAV, FLAC, OGG, MP3, MP4),
    "video": (MP4, MATROSKA),
    "picture": (PNG, JPEG, WEBP),
}
CODECS: dict[Kind, frozenset[str]] = {
    "sound": frozenset({"flac", "vorbis", "opus", "mp3", "mp3float", "aac"}),  # + PCM in WAV
    "video": frozenset({"h264", "hevc", "vp9", "av1", "prores", "ffv1"}),
    "picture": frozenset(),
}
WHAT: dict[Kind, str] = {"sound": "a sound file", "video": "a video file", "picture": "a picture"}
_QUICKTIME_ATOMS = (b"ftyp", b"moov", b"mdat", b"wide", b"free", b"skip", b"pnot")


class NotMedia(PermanentError):
    """A file that is not media of the kind asked for; its text completes "FILE ..."."""


def accepted_names(kind: Kind) -> str:
    return _either([c.name for c in ACCEPTED[kind]])


def _either(names: list[str]) -> str:
    return ", ".join(names[:-1]) + " or " + names[-1]


def sniff(path: Path) -> Container | None:
    """The container the file's first bytes name, of any kind; None for anything else."""
    with open(path, "rb") as file:
        head = file.read(HEAD_BYTES)
        if head.startswith(b"ID3") and len(head) >= 10:
            # ID3v2: its size in 7-bit bytes, then the audio (MP3, or FLAC behind a tag).
            size = 10 + sum((b & 0x7F) << (7 * (3 - i)) for i, b in enumerate(head[6:10]))
            size += 10 if head[5] & 0x10 else 0  # a footer
            if size > MAX_ID3_BYTES:
                return None
            file.seek(size)
            after = file.read(4)
            return FLAC if after == b"fLaC" else MP3 if _mpeg_audio_sync(after) else None
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return PNG
    if head.startswith(b"\xff\xd8\xff"):
        return JPEG
    if head[:4] in (b"RIFF", b"RF64", b"BW64") and head[8:12] == b"WAVE":
        return WAV
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return WEBP
    if head.startswith(b"fLaC"):
        return FLAC
    if head.startswith(b"OggS"):
        return OGG
    if head.startswith(b"\x1a\x45\xdf\xa3"):
        return MATROSKA
    if head[4:8] in _QUICKTIME_ATOMS:
        return MP4
    if _mpeg_audio_sync(head):
        return MP3
    return None


def _mpeg_audio_sync(head: bytes) -> bool:
    """An MPEG audio frame header (layer I-III; not ADTS AAC, whose layer bits are 0)."""
    return (len(head) >= 3 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0
            and (head[1] >> 1) & 3 != 0 and head[2] >> 4 != 0xF)  # fmt: skip


def identify(path: Path, kind: Kind) -> Container:
    """The container of a file of this kind, by its bytes; NotMedia when they name none of
    the kind's (the message never repeats the file's path: no oracle for what the server
    holds)."""
    found = sniff(path)
    if found is None or found not in ACCEPTED[kind]:
        what = f"holds {found.name}" if found is not None else "its bytes are none of them"
        raise NotMedia(f"is not {WHAT[kind]} ({accepted_names(kind)}: {what})")
    return found


def ffmpeg_input(path: Path, kind: Kind, *, loop: bool = False) -> list[str]:
    """The ffmpeg arguments that open ``path`` as this kind: its one demuxer, `file` the only
    protocol, no data references, then `-i`."""
    container = identify(path, kind)
    options = ["-stream_loop", "-1"] if loop else []
    options += ["-f", container.demuxer, "-protocol_whitelist", "file"]
    if container is MP4:
        options += ["-enable_drefs", "0"]
    return [*options, "-i", str(path)]


def open_media(path: Path, kind: Kind) -> av.container.InputContainer:
    """The file opened by PyAV as this kind, by the demuxer its bytes name (NotMedia when
    they name none); the caller checks its streams with `codec_problem`."""
    container = identify(path, kind)
    options = {"protocol_whitelist": "file"}
    if container is MP4:
        options["enable_drefs"] = "0"
    return av.open(str(path), format=container.demuxer, options=options)


def codec_problem(stream: av.stream.Stream, kind: Kind) -> str | None:
    """Why the stream's codec is not one this kind accepts, or None."""
    name = stream.codec_context.name
    if kind == "sound" and name.startswith("pcm_"):
        return None
    if name in CODECS[kind]:
        return None
    accepted = sorted(c for c in CODECS[kind] if c != "mp3float") + (
        ["PCM"] if kind == "sound" else [])  # fmt: skip
    return f"is {name}; {WHAT[kind]} here is {_either(accepted)}"


def reader_error(exc: BaseException, path: Path) -> str:
    """A reader's error as a submit or a job shows it: without the file's path (no oracle
    for what the server holds), at most 200 characters."""
    return str(exc).replace(f"'{path}'", "the file").replace(str(path), "the file")[:200]
