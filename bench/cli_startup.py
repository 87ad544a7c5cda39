"""CLI start-up benchmark: `factory jobs` on an empty home, this tree against an older commit.

    python bench/cli_startup.py [--baseline-ref d5cdaae~1] [--runs 5] [--command jobs]

The baseline is a checkout of BASELINE_REF (default: the commit before the CLI's imports
were made lazy, issue 35) in a temporary git worktree, run by the same interpreter with its
tree first on PYTHONPATH. The two are timed in turns (the machine is noisy), each a fresh
process with the embedded defaults, on two homes: a fresh empty FACTORY_HOME (the command's
first run there creates the SQLite database and migrates it, which imports Alembic) and a
home whose database that first run made (every later run). Reported: the best of RUNS for
each and their ratio (the target: at most 0.5), and which heavy modules each imports.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HOMES = ("on an empty home", "on a home with its database")
HEAVY = ("alembic", "numpy", "torch", "celery", "redis", "av", "PIL", "diffusers", "sqlalchemy")
PROBE = (
    "import sys, runpy; sys.argv = ['factory', *ARGS]\n"
    "try:\n    runpy.run_module('factory', run_name='__main__')\n"
    "except SystemExit:\n    pass\n"
    "import json; print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & set(HEAVY))),"
    " file=sys.stderr)\n"
)


def run_once(tree: Path, args: list[str], home: Path) -> tuple[float, list[str]]:
    env = {**os.environ, "PYTHONPATH": str(tree), "FACTORY_HOME": str(home),
           "FACTORY_DATABASE_URL": "", "FACTORY_BROKER_URL": "", "FACTORY_REDIS_URL": "",
           "FACTORY_STORE_URL": ""}  # fmt: skip
    code = PROBE.replace("ARGS", repr(args)).replace("HEAVY", repr(HEAVY))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=tree,
                          capture_output=True, text=True, check=False)  # fmt: skip
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{tree}: factory {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return elapsed, json.loads(done.stderr.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-ref", default="d5cdaae~1")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--command", default="jobs")
    options = parser.parse_args()
    args = options.command.split()
    with tempfile.TemporaryDirectory(prefix="cli-startup-") as scratch:
        baseline = Path(scratch) / "baseline"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach",
                        str(baseline), options.baseline_ref], check=True)  # fmt: skip
        try:
            trees = {"baseline": baseline, "this tree": REPO}
            times = {(home, name): [] for home in HOMES for name in trees}
            heavy: dict[tuple[str, str], list[str]] = {}
            for run in range(options.runs + 1):  # the first round warms the file cache
                for name, tree in trees.items():
                    home = Path(scratch) / f"home-{name.replace(' ', '-')}-{run}"
                    for kind in HOMES:  # the empty home first: its run makes the database
                        elapsed, modules = run_once(tree, args, home)
                        if run:
                            times[kind, name].append(elapsed)
                        heavy[kind, name] = modules
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                            str(baseline)], check=False)  # fmt: skip
    best = {key: min(values) for key, values in times.items()}
    for kind in HOMES:
        print(f"factory {options.command}, {kind}, best of {options.runs} (in turns):")
        for name in trees:
            ref = options.baseline_ref if name == "baseline" else "HEAD + work tree"
            print(f"  {name:<10} ({ref}): {best[kind, name]:.3f} s   heavy imports: "
                  f"{', '.join(heavy[kind, name]) or 'none'}")  # fmt: skip
        ratio = best[kind, "this tree"] / best[kind, "baseline"]
        print(f"  ratio this tree / baseline: {ratio:.2f} (target <= 0.50)")


if __name__ == "__main__":
    main()
