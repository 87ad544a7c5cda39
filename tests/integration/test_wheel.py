"""The built wheel carries every file the package reads at run time (what an image's
`pip install .` or an operator's `pip install factory-*.whl` gets): not only the modules, but
the console's templates and static files and the migrations' template."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import REPO


def test_the_wheel_holds_every_tracked_file_of_the_packages(tmp_path: Path) -> None:
    # Built from the tracked files alone (as an image copies them): a checkout's build/ or
    # egg-info left by an editable install would hide what the configuration leaves out.
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, check=True, capture_output=True,
                            text=True).stdout.split()  # fmt: skip
    source = tmp_path / "source"
    for name in listed:
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp_path), str(source)],
                   check=True, capture_output=True, timeout=600)  # fmt: skip
    [wheel] = tmp_path.glob("*.whl")
    inside = set(zipfile.ZipFile(wheel).namelist())
    tracked = [n for n in listed if n.split("/", 1)[0] in ("factory", "tasks", "migrations")]
    assert tracked, "git ls-files found nothing"
    missing = sorted(path for path in tracked if path not in inside)
    assert not missing, f"the wheel leaves out {missing}"
    assert "factory/web/templates/job.html" in inside
