"""Loading manifest documents safely: YAML without tags, aliases or duplicate keys; strict JSON.

A manifest comes from whoever writes the nightly file, so the loader refuses everything a
plain mapping of settings does not need: custom tags (object construction), aliases (the
"billion laughs" expansion bomb), duplicate keys (the second silently winning), implicit
timestamps (``2026-11-29`` stays a string), and nesting deeper than any manifest needs.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

MAX_DEPTH = 32
MAX_NUMBER_CHARS = 100  # far beyond any manifest value; Python refuses ints over 4300 digits


class DocumentError(ValueError):
    """The text is not an acceptable document; the message says where (line) and why."""


class _ManifestYamlLoader(yaml.SafeLoader):
    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise DocumentError(
                f"line {event.start_mark.line + 1}: YAML aliases (*{event.anchor}) are not "
                "allowed; put shared values under `defaults`"
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.setdefault(key, line)
            except TypeError:
                raise DocumentError(f"line {line}: a mapping key must be a plain value") from None
            if first != line:
                message = f"line {line}: duplicate key {key!r} (first set on line {first})"
                raise DocumentError(message)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        if len(node.value) > MAX_NUMBER_CHARS:
            raise DocumentError(_long_number(len(node.value), node.start_mark.line + 1))
        return super().construct_yaml_int(node)


def _long_number(length: int, line: int | None = None) -> str:
    where = f"line {line}: " if line else ""
    return (
        f"{where}a number of {length} characters; the most a manifest takes is {MAX_NUMBER_CHARS}"
    )


_ManifestYamlLoader.add_constructor("tag:yaml.org,2002:int", _ManifestYamlLoader.construct_yaml_int)


# Keep dates as strings: a batch called 2026-11-29 must not become a datetime.date.
_ManifestYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load_yaml(text: str) -> Any:
    try:
        document = yaml.load(text, Loader=_ManifestYamlLoader)
    except DocumentError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}: " if mark else ""
        problem = exc.problem or exc.context or "not valid YAML"
        if "could not determine a constructor for the tag" in problem:
            tag = problem.rsplit(" ", 1)[-1]
            problem = f"the YAML tag {tag} is not allowed (plain values, lists and mappings only)"
        raise DocumentError(f"{where}{problem}") from None
    except yaml.YAMLError as exc:
        raise DocumentError(str(exc)) from None
    except RecursionError:
        raise DocumentError(f"nesting deeper than {MAX_DEPTH} levels") from None
    _check_depth(document)
    return document


def load_json(text: str) -> Any:
    def refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                raise DocumentError(f"duplicate key {key!r}")
            result[key] = value
        return result

    def bounded_int(digits: str) -> int:
        if len(digits) > MAX_NUMBER_CHARS:
            raise DocumentError(_long_number(len(digits)))
        return int(digits)

    try:
        document = json.loads(text, object_pairs_hook=refuse_duplicates, parse_int=bounded_int)
    except json.JSONDecodeError as exc:
        raise DocumentError(f"line {exc.lineno}: {exc.msg}") from None
    except RecursionError:
        raise DocumentError(f"nesting deeper than {MAX_DEPTH} levels") from None
    _check_depth(document)
    return document


def _check_depth(document: Any) -> None:
    stack: list[tuple[Any, int]] = [(document, 0)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise DocumentError(f"nesting deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
