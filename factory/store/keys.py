"""Where everything of a job lives in the store: `{batch}/{video}/…` (DESIGN.md)."""

from __future__ import annotations


def job_prefix(batch: str, video: str) -> str:
    return f"{batch}/{video}"


def segment(batch: str, video: str, index: int) -> str:
    return f"{batch}/{video}/segments/{index:05d}.mkv"


def tail(batch: str, video: str, index: int) -> str:
    return f"{batch}/{video}/segments/{index:05d}.tail.npy"


def thumbs(batch: str, video: str, index: int) -> str:
    """Small pictures of a segment's first frame after its seam and its last written frame."""
    return f"{batch}/{video}/segments/{index:05d}.thumbs.png"


def chunk(batch: str, video: str, rendition: str, index: int) -> str:
    return f"{batch}/{video}/chunks/{rendition}/{index:05d}.mp4"


def joined(batch: str, video: str, rendition: str) -> str:
    return f"{batch}/{video}/work/{rendition}.video.mp4"


def audio(batch: str, video: str) -> str:
    return f"{batch}/{video}/work/audio.m4a"


def muxed(batch: str, video: str, rendition: str) -> str:
    return f"{batch}/{video}/work/{rendition}.mp4"


def output(batch: str, video: str, rendition: str) -> str:
    return f"{batch}/{video}/out/{rendition}.mp4"


def qc_report(batch: str, video: str) -> str:
    return f"{batch}/{video}/qc.json"
