from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from factory.errors import BadInput
from factory.store.file import FileStore


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    return FileStore(tmp_path / "store")


@pytest.mark.parametrize(
    "key",
    ["../x", "a/../../x", "/etc/passwd", "a//b", "", "a/./b", "a\\b", "a/.hidden/../b", "a/b/"],
)
def test_keys_that_could_leave_the_root_are_refused(store: FileStore, key: str):
    with pytest.raises(BadInput):
        store.put_bytes(key, b"x")


def test_a_symlink_out_of_the_root_is_refused(store: FileStore, tmp_path: Path):
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, store.root / "escape")
    with pytest.raises(BadInput, match="outside the store"):
        store.put_bytes("escape/file", b"x")
    assert not (outside / "file").exists()


def test_put_is_atomic_and_leaves_no_temporary_files(store: FileStore, tmp_path: Path):
    source = tmp_path / "a.bin"
    source.write_bytes(b"data" * 1000)
    store.put_file("b/j/out/master.mp4", source)
    store.put_bytes("b/j/qc.json", b"{}")
    assert store.path("b/j/out/master.mp4").read_bytes() == source.read_bytes()
    assert sorted(store.list("b")) == ["b/j/out/master.mp4", "b/j/qc.json"]
    assert [p.name for p in store.root.rglob("*") if "part" in p.name] == []
    store.put_file("b/j/moved.bin", source, move=True)
    assert not source.exists() and store.exists("b/j/moved.bin")


def test_a_failed_write_leaves_the_old_content(store: FileStore, tmp_path: Path):
    store.put_bytes("k/v.txt", b"old")
    with pytest.raises(FileNotFoundError):
        store.put_file("k/v.txt", tmp_path / "missing")
    assert store.path("k/v.txt").read_bytes() == b"old"


def test_local_path_of_a_missing_key(store: FileStore):
    with pytest.raises(FileNotFoundError), store.local_path("no/such.key"):
        pass


def test_writers_sharing_a_process_or_a_volume_never_share_a_temporary_file(store: FileStore):
    """Threads of one process (one pid) and hosts on one NFS volume write the same key at
    once: every write lands whole, none fails on another's temporary file."""
    from concurrent.futures import ThreadPoolExecutor

    payloads = [bytes([i]) * 200_000 for i in range(16)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda data: store.put_bytes("same/key.bin", data), payloads))
    assert store.path("same/key.bin").read_bytes() in payloads
    assert not [p for p in store.path("same").iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("how", ["bytes", "copy", "move"])
def test_a_write_survives_gc_pruning_its_folder(tmp_path: Path, how: str):
    """gc (delete_many) removes the folders it emptied while a new run writes into the same
    folder: the write lands whole, it never fails because its folder went away under it."""
    store = FileStore(tmp_path / "store", durable=False)
    source = tmp_path / "source.bin"
    stop, errors = threading.Event(), []

    def prune() -> None:  # gc: old keys of the folder deleted, then the emptied folders
        while not stop.is_set():
            store.delete_many(["b/v/segments/00000-a1.mkv", "b/v/chunks/00000.mkv"])

    pruner = threading.Thread(target=prune, daemon=True)
    pruner.start()
    written, deadline = 0, time.monotonic() + 3
    try:
        while time.monotonic() < deadline and not errors:
            key = f"b/v/segments/{written:05d}-a2.mkv"
            try:
                if how == "bytes":
                    store.put_bytes(key, b"frames")
                else:
                    source.write_bytes(b"frames")
                    store.put_file(key, source, move=how == "move")
            except OSError as exc:
                errors.append(f"write {written}: {type(exc).__name__}: {exc}")
                break
            assert store.path(key).read_bytes() == b"frames"
            store.delete(key)  # the folder is empty again: the next write races the pruner
            written += 1
    finally:
        stop.set()
        pruner.join(5)
    assert errors == [], f"{errors} (after {written} writes)"
    assert written > 100
