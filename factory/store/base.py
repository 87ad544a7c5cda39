"""The store interface and the rules every key follows."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from factory.errors import BadInput

_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class ObjectInfo:
    size: int
    sha256: str | None  # recorded at upload (s3); None if unknown (file: size+mtime etag)
    etag: str = ""


class Store(Protocol):
    url: str

    def put_file(self, key: str, source: Path, *, move: bool = False) -> None: ...

    def put_bytes(self, key: str, data: bytes) -> None: ...

    def exists(self, key: str) -> bool: ...

    def stat(self, key: str) -> ObjectInfo | None: ...  # None when absent

    def local_path(self, key: str) -> AbstractContextManager[Path]: ...

    def url_for(self, key: str) -> str: ...

    def list(self, prefix: str) -> Iterator[str]: ...

    def delete(self, key: str) -> None: ...  # absent keys are fine

    def list_sizes(self, prefix: str) -> Iterator[tuple[str, int]]: ...  # (key, bytes), as list

    # Remove many keys at once (absent ones are fine); returns the keys that could not be
    # removed, each with why. S3: DeleteObjects, up to 1000 keys a request.
    def delete_many(self, keys: Sequence[str]) -> dict[str, str]: ...

    # Bytes ``start`` to ``end`` inclusive (an HTTP Range), streamed in pieces: the console
    # serves media from here without a whole-file copy. FileNotFoundError when absent.
    def read_range(self, key: str, start: int, end: int) -> Iterator[bytes]: ...


def check_key(key: str) -> str:
    """Keys are relative, '/'-separated, of safe parts: nothing can climb out of the root."""
    parts = key.split("/")
    if not key or any(not _PART.match(part) or part in (".", "..") for part in parts):
        raise BadInput(
            f"{key!r} is not a valid store key (parts of A-Z a-z 0-9 . _ -, no '..')", field="key"
        )
    return key
