"""What the docs (README.md, docs/*.md) show, read for the docs tests: the `factory`
commands in their code blocks and code spans, and the code spans themselves."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^\s*```(\w*)")
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
SUBSTITUTION = re.compile(r"\$\([^()]*\)")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SHELL_OPERATORS = {"&", "&&", "|", "||", ";", ">", ">>", "2>&1", "<"}


@dataclass(frozen=True)
class Shown:
    where: str  # README.md:42
    argv: tuple[str, ...]  # the words after `factory`


def code_lines(path: Path) -> Iterator[tuple[int, str, str]]:
    """(line number, fence language, line) of every line inside a fenced code block."""
    language = None
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        fence = FENCE.match(line)
        if fence:
            language = None if language is not None else fence.group(1)
            continue
        if language is not None:
            yield number, language, line


def prose_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) of every line outside the code blocks."""
    inside = False
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if FENCE.match(line):
            inside = not inside
        elif not inside:
            yield number, line


def spans(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of every `code span` outside the code blocks."""
    for number, line in prose_lines(path):
        for found in SPAN.finditer(line):
            yield number, found.group(1)


def _compose_app_services() -> set[str]:
    """compose services whose entry point is `factory` (`run --rm console token list`)."""
    raw = yaml.safe_load((REPO / "docker" / "compose.yaml").read_text())
    return {name for name, s in raw["services"].items() if "video-factory" in str(s.get("image"))}


def _words(text: str) -> list[str]:
    text = SUBSTITUTION.sub("X", text)
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        return list(lexer)
    except ValueError:  # an unbalanced quote in an example's output
        return text.split()


def _commands_in(words: list[str], compose_apps: set[str]) -> Iterator[list[str]]:
    """The argv after each `factory` that starts a command in these shell words."""
    start = True
    for i, word in enumerate(words):
        if word in SHELL_OPERATORS or set(word) <= set(";&|<>"):
            start = True
            continue
        program = word
        assignment = ASSIGNMENT.match(word)
        if assignment and start:
            program = word[assignment.end() :]
            if not program.endswith("/factory"):
                continue  # VAR=value factory …: still the start of the command
        after_runner = (i >= 2 and words[i - 2] == "exec") or (i >= 1 and words[i - 1] == "--")
        runs_image = (
            word in compose_apps
            and "run" in words[:i]
            and "compose" in " ".join(words[:i])
            and all(w.startswith("-") for w in words[words.index("run") + 1 : i])
        )
        is_factory = program == "factory" or program.endswith("/bin/factory")
        if ((start or after_runner) and is_factory) or runs_image:  # runs_image: its entry point
            yield _until_operator(words[i + 1 :])
        start = False


def _until_operator(words: list[str]) -> list[str]:
    argv = []
    for word in words:
        if word in SHELL_OPERATORS or set(word) <= set(";&|<>") or not word.isascii():
            break
        argv.append(word)
    return argv


def shown_commands() -> list[Shown]:
    """Every `factory …` command the docs show: in code blocks (shell lines, systemd's
    ExecStart=) and in code spans (`factory requeue JOB [--from STAGE]`: brackets and
    alternatives `\\|` are the synopsis's, not the command's)."""
    compose_apps = _compose_app_services()
    found = []
    for path in DOCS:
        name = path.relative_to(REPO)
        for number, language, line in code_lines(path):
            text = line.strip().removeprefix("$ ")
            if language == "ini":
                if not text.startswith("ExecStart="):
                    continue
                text = text.removeprefix("ExecStart=")
            for argv in _commands_in(_words(text), compose_apps):
                found.append(Shown(f"{name}:{number}", tuple(argv)))
        for number, span in spans(path):
            if re.match(r"(\S*/bin/)?factory\s", span):
                synopsis = re.sub(r"\\?\|", " ", span.replace("[", " ").replace("]", " "))
                found.append(Shown(f"{name}:{number}", tuple(_words(synopsis)[1:])))
            else:  # `kubectl exec deploy/console -- factory token create …`
                for argv in _commands_in(_words(span), compose_apps):
                    found.append(Shown(f"{name}:{number}", tuple(argv)))
    return found
