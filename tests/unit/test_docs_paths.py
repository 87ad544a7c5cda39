"""Every repository file the docs name exists. A path is a token that starts with one of the
repository's top folders (`docker/k8s/models-pvc.yaml`, scripts/make-certs, docs/qc.md), in
prose, code spans or code blocks, or any `*.md` named anywhere; it must be in this
repository (a file beside it, outside the checkout, does not count)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.docs_text import DOCS, code_lines, prose_lines

TOP = r"(?:factory|tasks|scripts|docker|docs|bench|tests|examples|migrations)/"
REPO_PATH = re.compile(rf"(?<![\w./~$-])({TOP}[\w./@-]*)")
MARKDOWN = re.compile(r"(?<![\w/.-])((?:\.\./)*[\w./-]*\.md)\b")
# What the operator makes (git-ignored): the deployed certificates, the real env files
# (each from its .example), and the single env file of old stacks the upgrade note replaces.
MADE_BY_THE_OPERATOR = re.compile(r"docker/pki(/.*)?|docker/factory\.env")


def _in_repo(path: Path) -> bool:
    resolved = path.resolve()
    return resolved.is_relative_to(REPO.resolve()) and resolved.exists()


def _lines(path: Path) -> list[tuple[int, str]]:
    return [*prose_lines(path), *((n, line) for n, _, line in code_lines(path))]


def _missing(path: Path) -> list[str]:
    missing = []
    for number, line in _lines(path):
        for found in REPO_PATH.finditer(line):
            name = found.group(1).rstrip(".,;:)")
            if MADE_BY_THE_OPERATOR.fullmatch(name.rstrip("/")):
                continue
            if name.startswith("docker/env/") and (REPO / f"{name}.example").is_file():
                continue
            if not _in_repo(REPO / name):
                missing.append(f"{path.name}:{number}: {name}")
        for found in MARKDOWN.finditer(line):
            name = found.group(1)
            if not (_in_repo(REPO / name) or _in_repo(path.parent / name)):
                missing.append(f"{path.name}:{number}: {name}")
    return missing


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_file_a_doc_names_exists(path: Path) -> None:
    assert not _missing(path)


def test_the_check_finds_what_is_not_there(tmp_path: Path) -> None:
    doc = tmp_path / "__probe__.md"
    try:
        doc.write_text("See `docker/k8s/absent.yaml`, DESIGN.md and ../shared/x/README.md;\n"
                       "docs/qc.md and `docker/env/app.env` exist.\n")  # fmt: skip
        assert _missing(doc) == ["__probe__.md:1: docker/k8s/absent.yaml",
                                 "__probe__.md:1: DESIGN.md",
                                 "__probe__.md:1: ../shared/x/README.md"]  # fmt: skip
    finally:
        doc.unlink()
