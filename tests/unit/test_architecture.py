"""The layers, read from the code's own imports (issue 36): no import cycle; factory/ does
not stand on tasks/ (only the composition roots, the CLI and the web app, reach the workers'
package, to inject a dispatcher); nothing below the interfaces imports them or the
operations layer; and the interfaces (factory/cli, factory/web) reach below the operations
layer only where KNOWN says so today. KNOWN may only shrink: a pair that is gone must be
struck from it, and a new one is refused (put the rule in factory/ops/ instead).

Imports under `if TYPE_CHECKING:` are left out: they are names for type hints, not
dependencies at run time."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

LAYERED = ("factory", "tasks")
COMPOSITION_ROOTS = ("factory.cli", "factory.web.server")
# What the interfaces may use besides the operations layer: errors, settings, the stage
# names and the job's record are the vocabulary every layer shares.
SHARED = {
    "factory",
    "factory.ops",
    "factory.errors",
    "factory.config",
    "factory.stages",
    "factory.job",
}

# Where the interfaces still reach below the operations layer (2026-12-05). What is left is
# of four kinds: the composition roots building what they inject (cli/common, web/server:
# wiring, the store); the web's own authentication (access: tokens, sessions), which is
# not an operation; the GPU node's own commands (cli/gpu, cli/topology, cli/cluster), whose
# layer is factory/gpu/ and the worker processes, not the job lifecycle; and reading a
# manifest file or a store on the operator's disk (cli/main, cli/forecast, cli/qc,
# cli/schema's migrations). The web console and API reach nothing but
# access.
KNOWN: dict[str, set[str]] = {
    "factory.cli.cluster": {
        "factory.generate.devices",
        "factory.gpu.topology",
        "factory.infra.redact",
    },
    "factory.cli.common": {"factory.wiring"},
    "factory.cli.forecast": {"factory.manifest"},
    "factory.cli.gpu": {
        "factory.wiring",
        "factory.generate.memory_plan",
        "factory.gpu.report",
        "factory.manifest",
        "factory.pipeline.prompts",
        "factory.spec",
        "factory.store",
        "factory.store.assets",
    },
    "factory.cli.main": {"factory.manifest", "factory.store"},
    "factory.cli.qc": {"factory.qc.check_file"},
    "factory.cli.schema": {"factory.db", "factory.db.migrate", "factory.db.session"},
    "factory.cli.serve": {"factory.access", "factory.db.models"},
    "factory.cli.topology": {
        "factory.wiring",
        "factory.gpu.pool",
        "factory.gpu.registry",
        "factory.gpu.topology",
        "factory.infra",
        "factory.infra.logs",
    },
    "factory.web.api": {"factory.access"},
    "factory.web.server": {"factory.access", "factory.wiring", "factory.store"},
    "factory.web.auth": {"factory.access"},
    "factory.web.console": {"factory.access"},
    "factory.web.guard": {"factory.access"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every module name an import in `path` may mean (`from a import b`: a, and a.b)."""
    tree = ast.parse(path.read_text())
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for_types = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for statement in node.body
        for inner in ast.walk(statement)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in for_types:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                kept = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*kept, base] if base else kept)
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return found


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for top in LAYERED for p in (REPO / top).rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in files.items():
        targets = set()
        for target in imported(path):
            while target and target not in files:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(f"{target}."):
                targets.add(target)
        edges[name] = targets
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        order[node] = low[node] = len(order)
        stack.append(node)
        for nxt in edges[node]:
            if nxt not in order:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], order[nxt])
        if low[node] == order[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in order:
            visit(node)
    return found


def is_interface(name: str) -> bool:
    return name.startswith(("factory.cli", "factory.web"))


def is_operations(name: str) -> bool:
    return name == "factory.ops" or name.startswith("factory.ops.")


def below_operations(name: str) -> bool:
    return (
        name not in SHARED
        and not is_interface(name)
        and not is_operations(name)
        and not name.startswith("tasks")
    )


def test_no_module_imports_itself_back_through_others() -> None:
    assert cycles(graph()) == []


def test_factory_does_not_stand_on_tasks_outside_its_composition_roots() -> None:
    offending = {
        name: sorted(t for t in targets if t.startswith("tasks"))
        for name, targets in graph().items()
        if name.startswith("factory") and not name.startswith(COMPOSITION_ROOTS)
    }
    assert {name: t for name, t in offending.items() if t} == {}


def test_nothing_below_the_interfaces_imports_them_or_the_operations_layer() -> None:
    offending = {
        name: sorted(t for t in targets if is_operations(t) or is_interface(t))
        for name, targets in graph().items()
        if name.startswith("factory")
        and not is_interface(name)
        and not is_operations(name)
        and name != "factory.__main__"
    }
    assert {name: t for name, t in offending.items() if t} == {}


def test_the_interfaces_reach_below_the_operations_layer_no_further_than_known() -> None:
    reach = {
        name: {t for t in targets if below_operations(t)}
        for name, targets in graph().items()
        if is_interface(name)
    }
    new = {name: sorted(t - KNOWN.get(name, set())) for name, t in reach.items()}
    gone = {name: sorted(t - reach.get(name, set())) for name, t in KNOWN.items()}
    assert {n: t for n, t in new.items() if t} == {}, "put the rule in factory/ops/"
    assert {n: t for n, t in gone.items() if t} == {}, "struck from the code: strike from KNOWN"
