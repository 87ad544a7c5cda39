"""docs/manifest.md gives every model family's default segment, as factory/generate/families.py
has it, and names every family in the `model` row."""

from __future__ import annotations

from factory.generate.families import FAMILIES
from tests.conftest import REPO


def _row(field: str) -> str:
    text = (REPO / "docs" / "manifest.md").read_text()
    return next(line for line in text.splitlines() if line.startswith(f"| `{field}` |"))


def test_every_family_default_segment_is_in_the_manifest_reference() -> None:
    segment, model = _row("segment"), _row("model")
    for name, family in FAMILIES.items():
        expected = f"`{name}` {family.segment_frames}/{family.segment_overlap}"
        assert expected in segment, expected
        assert name in model, name
