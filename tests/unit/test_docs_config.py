"""docs/configuration.md lists every FACTORY_* variable the code reads, with its real
default: setting a variable to the default the table gives changes no setting."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from factory.config import Settings
from tests.conftest import REPO

TABLE = REPO / "docs" / "configuration.md"
NAME = re.compile(r"\bFACTORY_[A-Z0-9_]*[A-Z0-9]\b")
# Not settings: set by `factory worker` for its own processes, or a name redact.py masks.
NOT_SETTINGS = {"FACTORY_GPU_QUEUE", "FACTORY_GPU_INDEX", "FACTORY_MINIO_SECRET_KEY"}
# Defaults the table gives in words: nothing to set the variable to.
IN_WORDS = {"none", "chosen", "AWS", "system CAs", "the host name", "this node",
            "the store's bucket"}  # fmt: skip


def _read_in_code() -> set[str]:
    names = set()
    for folder in ("factory", "tasks"):
        for path in (REPO / folder).rglob("*.py"):
            names |= set(NAME.findall(path.read_text()))
    for path in (REPO / "scripts").iterdir():
        if path.is_file():
            names |= set(NAME.findall(path.read_text(errors="replace")))
    return names - NOT_SETTINGS


def _rows() -> dict[str, str]:
    """variable -> its default cell, for each row of the table (several per row: `A`, `B`
    | 1, 2)."""
    rows = {}
    for line in TABLE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        names = re.findall(r"`([A-Z][A-Z0-9_]*)`", cells[0])
        values = [v.strip() for v in cells[1].split(",")] if len(names) > 1 else [cells[1]]
        if len(values) == 1:  # one default for them all (none)
            values *= len(names)
        assert len(values) == len(names), line
        rows |= dict(zip(names, values, strict=True))
    return rows


def test_every_variable_read_is_in_the_table() -> None:
    listed = set(_rows())
    missing = sorted(_read_in_code() - listed)
    assert not missing, f"not in docs/configuration.md: {missing}"


@pytest.mark.parametrize(
    ("name", "default"),
    [(n, d) for n, d in _rows().items() if n.startswith("FACTORY_") and d not in IN_WORDS],
)
def test_the_default_in_the_table_is_the_real_one(name: str, default: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    base = {"FACTORY_HOME": str(home)}
    value = default.strip("`").replace("$FACTORY_HOME", str(home))
    if name == "FACTORY_HOME":
        base, value = {}, value  # ~/.factory: the user's home
    assert Settings.from_env({**base, name: value}) == Settings.from_env(base), (name, default)


def test_the_comparison_sees_a_wrong_default(tmp_path: Path) -> None:
    base = {"FACTORY_HOME": str(tmp_path)}
    assert Settings.from_env({**base, "FACTORY_STALE_AFTER": "301"}) != Settings.from_env(base)
    assert Settings.from_env({**base, "FACTORY_WORKER_ALLOW_CPU": "1"}) != Settings.from_env(base)
