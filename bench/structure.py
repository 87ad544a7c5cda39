"""The structure's figures (issue 36): modules over 500 lines, functions over 60 lines, the
modules at the root of factory/, import cycles, and where the interfaces reach below the
operations layer. Read from the code (Python's ast), not run.

    .venv/bin/python bench/structure.py            # this checkout
    .venv/bin/python bench/structure.py --at REV   # another commit, for a before/after
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.unit import test_architecture as layers  # noqa: E402

MODULE_LINES, FUNCTION_LINES = 500, 60


def figures(root: Path) -> dict[str, object]:
    files = sorted(p for top in ("factory", "tasks") for p in (root / top).rglob("*.py"))
    long_modules, long_functions = [], []
    for path in files:
        text = path.read_text()
        name = str(path.relative_to(root))
        if text.count("\n") > MODULE_LINES:
            long_modules.append((name, text.count("\n")))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > FUNCTION_LINES:
                    long_functions.append((f"{name}:{node.name}", length))
    layers.REPO = root
    edges = layers.graph()
    reach = sum(
        len({t for t in targets if layers.below_operations(t)})
        for name, targets in edges.items()
        if layers.is_interface(name)
    )
    return {
        "modules over 500 lines": sorted(long_modules, key=lambda m: -m[1]),
        "functions over 60 lines": sorted(long_functions, key=lambda f: -f[1]),
        "modules at the root of factory/": sorted(p.name for p in (root / "factory").glob("*.py")),
        "import cycles": layers.cycles(edges),
        "factory/ modules importing tasks/": sorted(
            n
            for n, t in edges.items()
            if n.startswith("factory") and any(x.startswith("tasks") for x in t)
        ),
        "interface -> below-ops imports": reach,
    }


def checkout(rev: str) -> Path:
    scratch = Path(tempfile.mkdtemp(prefix="structure-"))
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "factory", "tasks"],
                             check=True, capture_output=True).stdout  # fmt: skip
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(scratch, filter="data")
    return scratch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--at", help="a commit to measure instead of the working tree")
    args = parser.parse_args()
    found = figures(checkout(args.at) if args.at else REPO)
    for label, value in found.items():
        if isinstance(value, list):
            print(f"{label}: {len(value)}")
            for item in value:
                print(f"  {item[0]} {item[1]}" if isinstance(item, tuple) else f"  {item}")
        else:
            print(f"{label}: {value}")


if __name__ == "__main__":
    main()
