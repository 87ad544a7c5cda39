"""The bytes decide a file's type (factory/media/identify.py): each container the factory
accepts by its magic number, everything else (whatever its name) by none."""

from __future__ import annotations

from pathlib import Path

import pytest

from factory.media import identify
from factory.media.identify import NotMedia, ffmpeg_input, sniff
from tests.conftest import REPO

pytestmark = pytest.mark.fast


def id3(size: int, then: bytes) -> bytes:
    syncsafe = bytes((size >> shift) & 0x7F for shift in (21, 14, 7, 0))
    return b"ID3\x04\x00\x00" + syncsafe + b"\x00" * size + then


KNOWN = {
    "png": (b"\x89PNG\r\n\x1a\n" + b"\x00" * 20, identify.PNG),
    "jpeg": (b"\xff\xd8\xff\xe0\x00\x10JFIF", identify.JPEG),
    "webp": (b"RIFF\x10\x00\x00\x00WEBPVP8 ", identify.WEBP),
    "wav": (b"RIFF\x10\x00\x00\x00WAVEfmt ", identify.WAV),
    "rf64": (b"RF64\xff\xff\xff\xffWAVEds64", identify.WAV),
    "flac": (b"fLaC\x00\x00\x00\x22", identify.FLAC),
    "flac behind id3": (id3(300, b"fLaC"), identify.FLAC),
    "mp3 behind id3": (id3(40, b"\xff\xfb\x90\x64"), identify.MP3),
    "mp3": (b"\xff\xfb\x90\x64" + b"\x00" * 8, identify.MP3),
    "ogg": (b"OggS\x00\x02" + b"\x00" * 8, identify.OGG),
    "matroska": (b"\x1a\x45\xdf\xa3\x9f\x42\x86\x81", identify.MATROSKA),
    "mp4": (b"\x00\x00\x00\x20ftypisom\x00\x00\x02\x00", identify.MP4),
    "quicktime": (b"\x00\x00\x00\x08wide\x00\x00\x00\x10mdat", identify.MP4),
}
UNKNOWN = {
    "dash": b'<?xml version="1.0"?><MPD xmlns="urn:mpeg:dash:schema:mpd:2011">',
    "hls": b"#EXTM3U\n#EXT-X-VERSION:3\n",
    "ffconcat": b"ffconcat version 1.0\nfile 'x.wav'\n",
    "sdp": b"v=0\no=- 0 0 IN IP4 127.0.0.1\nm=audio 5004 RTP/AVP 96\n",
    "adts aac": b"\xff\xf1\x50\x80\x02\x1f\xfc",
    "empty": b"",
    "truncated": b"\x89P",
    "gif": b"GIF89a\x01\x00\x01\x00",
    "mpegts": b"\x47\x40\x00\x10" + b"\xff" * 184,
    "id3 over nothing": id3(10, b"<MPD"),
    "html": b"<!doctype html><video src=/etc/passwd>",
}


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_each_accepted_container_by_its_magic(tmp_path: Path, name: str) -> None:
    data, container = KNOWN[name]
    path = tmp_path / "no-extension"
    path.write_bytes(data)
    assert sniff(path) is container


@pytest.mark.parametrize("name", sorted(UNKNOWN))
def test_anything_else_is_none_whatever_its_name(tmp_path: Path, name: str) -> None:
    path = tmp_path / "bed.wav"
    path.write_bytes(UNKNOWN[name])
    assert sniff(path) is None
    for kind in ("sound", "video", "picture"):
        with pytest.raises(NotMedia, match="its bytes are none of them") as refused:
            identify.identify(path, kind)
        assert str(path) not in str(refused.value)


def test_a_container_of_another_kind_is_named(tmp_path: Path) -> None:
    path = tmp_path / "move.mp4"
    path.write_bytes(KNOWN["png"][0])
    with pytest.raises(
        NotMedia, match=r"is not a video file \(MP4/MOV or Matroska/WebM: holds PNG"
    ):
        identify.identify(path, "video")


def test_the_examples_material_opens_by_its_one_reader() -> None:
    assets = REPO / "examples" / "assets"
    assert ffmpeg_input(assets / "calm-bed.ogg", "sound")[:4] == [
        "-f", "ogg", "-protocol_whitelist", "file"]  # fmt: skip
    assert ffmpeg_input(assets / "camera-pan.mp4", "video", loop=True) == [
        "-stream_loop", "-1", "-f", "mov", "-protocol_whitelist", "file", "-enable_drefs", "0",
        "-i", str(assets / "camera-pan.mp4")]  # fmt: skip
