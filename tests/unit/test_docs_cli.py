"""Every `factory …` command the docs show exists as shown: its command and subcommand, and
every flag it gives, resolved against the CLI's own app object (no process per command);
and what the docs say about `--json` is what the CLI does."""

from __future__ import annotations

import re
from typing import Any

import pytest
import typer

from factory.cli.main import app
from tests.conftest import REPO
from tests.docs_text import DOCS, Shown, prose_lines, shown_commands

ROOT = typer.main.get_command(app)
JSON_LIST = re.compile(r"take `--json` for scripts: (.+?)\.", re.DOTALL)


def _options(command: Any) -> dict[str, bool]:
    """Every flag of a command (and the root's), and whether it takes a value."""
    found = {"--help": False}
    for owner in (ROOT, command):
        for param in owner.params:
            if param.param_type_name != "option":
                continue
            takes_value = not (param.is_flag or param.count)
            for name in [*param.opts, *param.secondary_opts]:
                found[name] = takes_value
    return found


def resolve(argv: tuple[str, ...]) -> tuple[Any, list[str], list[str]]:
    """The command argv names, the path to it, and what in argv the CLI would not take."""
    command, path, words = ROOT, [], list(argv)
    while words and words[0].startswith("--") and words[0] in _options(ROOT):
        words.pop(0)  # factory --debug …
    while hasattr(command, "commands"):
        if not words:
            return command, path, []  # `factory gpu`: the group itself, as prose names it
        name = words.pop(0)
        if name not in command.commands:
            return command, path, [f"no command {' '.join([*path, name])!r}"]
        command, path = command.commands[name], [*path, name]
    options, problems = _options(command), []
    while words:
        word = words.pop(0)
        if not word.startswith("-") or word == "-":
            continue  # an argument, or a placeholder (JOB, MANIFEST)
        flag = word.split("=", 1)[0]
        if flag not in options:
            problems.append(f"{' '.join(path)} has no option {flag}")
        elif options[flag] and "=" not in word and words:
            words.pop(0)
    return command, path, problems


def _commands_with_json() -> set[str]:
    found = set()

    def walk(command: Any, path: list[str]) -> None:
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                walk(sub, [*path, name])
        elif "--json" in _options(command):
            found.add(" ".join(path))

    walk(ROOT, [])
    return found


def test_the_docs_show_commands() -> None:
    shown = shown_commands()
    assert len(shown) > 100
    where = {s.where.split(":")[0] for s in shown}
    assert {"README.md", "docs/deploy.md", "docs/operations.md"} <= where


@pytest.mark.parametrize("shown", shown_commands(), ids=lambda s: s.where)
def test_every_command_shown_exists_with_its_flags(shown: Shown) -> None:
    _, _, problems = resolve(shown.argv)
    assert not problems, f"{shown.where}: factory {' '.join(shown.argv)}: {problems}"


def test_the_resolver_catches_mistakes() -> None:
    assert resolve(("worker", "--gpu", "0", "--health-port", "9100"))[2] == []
    assert resolve(("token", "revoke", "--json", "alice"))[2] == [
        "token revoke has no option --json"
    ]
    assert resolve(("store", "rm", "x"))[2] == ["no command 'store rm'"]
    assert resolve(("gc", "--older=7d"))[2] == ["gc has no option --older"]
    assert resolve(("--debug", "jobs", "--stage", "done", "--json"))[2] == []


def test_every_json_claim_is_true() -> None:
    """No "every command takes --json"; the README's list of those that do is exact."""
    for path in DOCS:
        for number, line in prose_lines(path):
            assert not re.search(r"(every|all|each) (command|subcommand)s? (take|accept|ha)",
                                 line, re.I), f"{path.name}:{number}: {line}"  # fmt: skip
    readme = (REPO / "README.md").read_text()
    listed = JSON_LIST.search(readme)
    assert listed, "README.md lists the commands that take --json"
    named = {re.sub(r"\s+", " ", n) for n in re.findall(r"`([a-z][a-z ]*)`", listed.group(1))}
    assert named == _commands_with_json()
