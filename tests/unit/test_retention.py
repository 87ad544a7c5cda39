"""The retention policy's pieces: durations, what counts as an intermediate, batched deletes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from factory.config import Settings, parse_duration
from factory.config.s3 import S3Settings
from factory.errors import ConfigError
from factory.ops.retention import classify, human_bytes
from factory.store.file import FileStore
from factory.store.s3 import S3Store


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("7d", 7 * 86400), ("36h", 36 * 3600), ("90m", 5400), ("45s", 45), ("0", 0),
     ("1w", 7 * 86400), ("1d12h", 36 * 3600), (" 2D ", 2 * 86400)],
)  # fmt: skip
def test_durations(text: str, seconds: int):
    assert parse_duration(text, "--older-than") == seconds


@pytest.mark.parametrize("text", ["7", "a week", "-1d", "1.5d", "d", "", "7 d"])
def test_bad_durations_name_the_option(text: str):
    with pytest.raises(ConfigError, match="must be a duration like 7d") as caught:
        parse_duration(text, "--older-than")
    assert caught.value.field == "--older-than" and caught.value.exit_code == 2


def test_the_retention_setting():
    assert Settings.from_env({}).keep_intermediates == 7 * 86400
    assert Settings.from_env({"FACTORY_KEEP_INTERMEDIATES": "36h"}).keep_intermediates == 129600
    assert Settings.from_env({"FACTORY_KEEP_INTERMEDIATES": "forever"}).keep_intermediates is None
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"FACTORY_KEEP_INTERMEDIATES": "7"})
    assert caught.value.field == "FACTORY_KEEP_INTERMEDIATES"


@pytest.mark.parametrize(
    ("rel", "kind"),
    [
        ("segments/00003-a12.mkv", "segment"),
        ("segments/00003.mkv", "segment"),
        ("segments/00003-a12.tail.npy", "tail"),
        ("segments/00003-a12.thumbs.png", None),
        ("chunks/mobile/00001-0123456789abcdef.mp4", "chunk"),
        ("work/a15/mobile.video.mp4", "joined"),
        ("work/a16/audio.m4a", "audio"),
        ("work/a16/mobile.mp4", "muxed"),
        ("work/mobile.mp4", "muxed"),
        ("work/a17/qc.json", None),
        ("work/a17/contact.png", None),
        ("work/a17/quality.png", None),
        ("out/mobile.mp4", None),
        ("qc.json", None),
        ("contact.png", None),
        ("quality.png", None),
        ("notes.txt", None),
    ],
)
def test_what_gc_removes_and_keeps(rel: str, kind: str | None):
    assert classify("nightly/harbor", f"nightly/harbor/{rel}") == kind


def test_keys_of_another_job_are_never_classified():
    assert classify("nightly/harbor", "nightly/harbor2/segments/00000.mkv") is None


def test_human_bytes():
    assert [human_bytes(n) for n in (0, 1023, 1536, 7.3 * (1 << 30))] == [
        "0 B", "1023 B", "1.5 KiB", "7.3 GiB"
    ]  # fmt: skip


def test_file_store_delete_many_prunes_the_folders_it_emptied(tmp_path: Path):
    store = FileStore(tmp_path / "store", durable=False)
    for key in ("b/v/segments/0.mkv", "b/v/segments/0.thumbs.png", "b/v/chunks/m/0.mp4",
                "b/v/out/m.mp4"):  # fmt: skip
        store.put_bytes(key, b"x" * 10)
    assert dict(store.list_sizes("b/v/chunks")) == {"b/v/chunks/m/0.mp4": 10}
    failed = store.delete_many(["b/v/segments/0.mkv", "b/v/chunks/m/0.mp4", "b/v/gone.mp4"])
    assert failed == {}
    assert list(store.list("b")) == ["b/v/out/m.mp4", "b/v/segments/0.thumbs.png"]
    assert not (store.root / "b/v/chunks").exists()
    assert (store.root / "b/v/segments").is_dir()


class _Client:
    """Answers DeleteObjects like S3 does: quiet, with per-key errors."""

    def __init__(self, refuse: set[str]) -> None:
        self.refuse, self.calls = refuse, []

    def delete_objects(self, Bucket: str, Delete: dict[str, Any]) -> dict[str, Any]:
        names = [o["Key"] for o in Delete["Objects"]]
        self.calls.append(names)
        errors = [{"Key": n, "Code": "AccessDenied", "Message": "Access Denied"}
                  for n in names if n in self.refuse]  # fmt: skip
        return {"Errors": errors} if errors else {}


def test_s3_delete_many_batches_by_1000_and_reports_per_key_errors():
    client = _Client(refuse={"pre/b/v/chunks/1500.mp4"})
    store = S3Store("s3://bucket/pre", S3Settings(), client=client)
    keys = [f"b/v/chunks/{i}.mp4" for i in range(2500)]
    failed = store.delete_many(keys)
    assert [len(c) for c in client.calls] == [1000, 1000, 500]
    assert client.calls[0][0] == "pre/b/v/chunks/0.mp4"
    assert failed == {"b/v/chunks/1500.mp4": "AccessDenied: Access Denied"}
