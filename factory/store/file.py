"""The `file://` store: a folder. Writes land under a temporary name and are renamed, so a
reader never sees a half file under a final key; keys cannot leave the root (checked on the
key, and again on the resolved path, which also defeats symlinks pointing out).

A write is durable before it returns (the file and its folder are fsynced): a checkpoint
recorded after it never points at a file that a power cut could still take away. Temporary
names carry the host, the process and a random part, so writers on several hosts sharing
one volume (NFS) never write into each other's temporary file.

gc prunes the folders it emptied (delete_many) while a new run may be writing into one of
them: a write creates its temporary file first, which keeps its folder and every folder
above it from being pruned (rmdir removes only an empty folder), and makes the folders and
creates it again if gc removed the folder in between."""

from __future__ import annotations

import os
import shutil
import socket
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, urlparse

from factory.errors import BadInput
from factory.store.base import ObjectInfo, check_key

_HOST = "".join(c if c.isalnum() or c in "-_" else "_" for c in socket.gethostname())[:40]
_PIN_ATTEMPTS = 100  # a folder pruned between mkdir and create this often in a row: give up


class FileStore:
    def __init__(self, root: Path, *, durable: bool = True) -> None:
        self.durable = durable  # FACTORY_STORE_FSYNC: off trades crash safety for speed
        self.root = root.resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.url = self.root.as_uri()

    @classmethod
    def from_url(cls, url: str, *, durable: bool = True) -> FileStore:
        return cls(Path(unquote(urlparse(url).path)), durable=durable)

    def path(self, key: str) -> Path:
        path = (self.root / check_key(key)).resolve()
        if not path.is_relative_to(self.root):
            raise BadInput(f"{key!r} resolves outside the store", field="key")
        return path

    def read_range(self, key: str, start: int, end: int) -> Iterator[bytes]:
        with self.path(key).open("rb") as handle:
            handle.seek(start)
            left = end - start + 1
            while left > 0:
                piece = handle.read(min(left, 1 << 20))
                if not piece:
                    return
                left -= len(piece)
                yield piece

    def put_file(self, key: str, source: Path, *, move: bool = False) -> None:
        target = self.path(key)
        tmp = _pinned_temporary(target)
        try:
            if move:
                os.replace(source, tmp) if _same_device(source, target.parent) else shutil.move(
                    source, tmp
                )
            else:
                shutil.copyfile(source, tmp)
            if self.durable:
                _fsync_file(tmp)
            os.replace(tmp, target)
            if self.durable:
                _fsync_dir(target.parent)
        finally:
            tmp.unlink(missing_ok=True)

    def put_bytes(self, key: str, data: bytes) -> None:
        target = self.path(key)
        tmp = _pinned_temporary(target)
        try:
            with open(tmp, "wb") as out:
                out.write(data)
                out.flush()
                if self.durable:
                    os.fdatasync(out.fileno())
            os.replace(tmp, target)
            if self.durable:
                _fsync_dir(target.parent)
        finally:
            tmp.unlink(missing_ok=True)

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def stat(self, key: str) -> ObjectInfo | None:
        """Size and a size+mtime fingerprint: cheap to ask before every use of an asset (no
        hashing of a multi-GB LoRA per job); a copy taken from here is hashed once."""
        path = self.path(key)
        if not path.is_file():
            return None
        st = path.stat()
        return ObjectInfo(st.st_size, None, f"{st.st_size}-{st.st_mtime_ns}")

    @contextmanager
    def local_path(self, key: str) -> Iterator[Path]:
        path = self.path(key)
        if not path.is_file():
            raise FileNotFoundError(f"{self.url_for(key)} does not exist")
        yield path

    def delete(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)

    def delete_many(self, keys: Sequence[str]) -> dict[str, str]:
        """Unlinks each file, then removes the folders this emptied (never the root, never a
        folder that still holds anything, a writer's temporary file included)."""
        failed: dict[str, str] = {}
        folders: set[Path] = set()
        for key in keys:
            try:
                path = self.path(key)
                path.unlink(missing_ok=True)
            except (OSError, BadInput) as exc:
                failed[key] = f"{type(exc).__name__}: {exc}"
                continue
            folders.add(path.parent)
        for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
            while folder != self.root and folder.is_relative_to(self.root):
                try:
                    folder.rmdir()  # only an empty folder goes
                except OSError:
                    break
                folder = folder.parent
        return failed

    def url_for(self, key: str) -> str:
        return self.path(key).as_uri()

    def list(self, prefix: str) -> Iterator[str]:
        base = self.path(prefix.rstrip("/")) if prefix.strip("/") else self.root
        if not base.exists():
            return
        for path in sorted(base.rglob("*")):
            if path.is_file() and not path.name.startswith("."):
                yield path.relative_to(self.root).as_posix()

    def list_sizes(self, prefix: str) -> Iterator[tuple[str, int]]:
        for key in self.list(prefix):
            try:
                yield key, (self.root / key).stat().st_size
            except FileNotFoundError:  # removed since it was listed
                continue


def _temporary(target: Path) -> Path:
    return target.with_name(f".{target.name}.part-{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:12]}")


def _pinned_temporary(target: Path) -> Path:
    """A new, empty temporary file beside `target`, its folders made as needed. While it
    exists, gc cannot prune its folder (nor any above it); gc may prune the folder between
    the mkdir and the create (FileNotFoundError), or between mkdir's own steps (it then
    says FileExistsError of a folder that is gone): the folders are made again."""
    attempt = 0
    while True:
        tmp = _temporary(target)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except (FileNotFoundError, FileExistsError):
            attempt += 1
            if attempt >= _PIN_ATTEMPTS:
                raise


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)  # the data and the size; the name is made durable by the folder's sync
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    """The rename itself is durable only once the folder's entry is on disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _same_device(a: Path, b: Path) -> bool:
    return os.stat(a).st_dev == os.stat(b).st_dev
