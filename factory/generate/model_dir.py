"""A diffusers model directory checked without loading anything (no torch): it exists, it has
`model_index.json`, and every component folder asked for is there. Used at submit (from any
host that sees the directory) and by a GPU worker before a job's first segment."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from factory.errors import PermanentError


class ModelDirProblem(PermanentError):
    def __init__(self, root: Path, reason: str, message: str | None = None) -> None:
        self.reason = reason  # what is wrong, for a message that already names the directory
        super().__init__(message or f"model directory {root}: {reason}")


def check_model_dir(path: str, needed: tuple[str, ...] | None = None) -> list[str]:
    """The component folders `model_index.json` names (or just `needed` of them); raises
    ModelDirProblem naming the first thing wrong: a directory that is not there, a folder
    without model_index.json, or the components it lacks."""
    root = Path(path)
    if not root.exists():
        raise ModelDirProblem(
            root,
            f"{root} does not exist",
            f"model directory {root} does not exist on this host ({socket.gethostname()})",
        )
    if not root.is_dir():
        raise ModelDirProblem(root, f"{root} is not a directory")
    index = root / "model_index.json"
    if not index.is_file():
        raise ModelDirProblem(
            root,
            "missing model_index.json (is this a diffusers pipeline folder saved with "
            "save_pretrained?)",
        )
    try:
        named = json.loads(index.read_text())
    except (OSError, ValueError) as exc:
        raise ModelDirProblem(root, f"model_index.json cannot be read: {exc}") from None
    components = [
        name
        for name, spec in named.items()
        if not name.startswith("_") and isinstance(spec, list) and spec and spec[0] is not None
    ]
    wanted = [name for name in components if needed is None or name in needed]
    absent = [name for name in (needed or ()) if name not in components]
    missing = sorted({name for name in wanted if not (root / name).is_dir()} | set(absent))
    if missing:
        raise ModelDirProblem(root, f"missing {', '.join(missing)}")
    return wanted


PYRAMID_SIZE_MULTIPLE = 64  # Helios mid/distilled: latent sides divisible by 8 (3 stages, patch 2)


def helios_variant(path: str) -> str:
    """base, mid or distilled, from the directory: HeliosPipeline is base; a pyramid pipeline
    is distilled when it says `is_distilled` (it then needs the DMD scheduler), else mid."""
    root = Path(path)
    try:
        index = json.loads((root / "model_index.json").read_text())
    except (OSError, ValueError) as error:
        raise ModelDirProblem(root, f"model_index.json cannot be read: {error}") from None
    pipeline = index.get("_class_name")
    scheduler = (index.get("scheduler") or [None, None])[1]
    if pipeline == "HeliosPipeline":
        return "base"
    if pipeline == "HeliosPyramidPipeline":
        distilled = bool(index.get("is_distilled"))
        wanted = "HeliosDMDScheduler" if distilled else "HeliosScheduler"
        if scheduler != wanted:
            raise ModelDirProblem(
                root,
                f"a Helios pyramid pipeline with is_distilled={distilled} needs {wanted}, "
                f"not {scheduler}",
            )
        return "distilled" if distilled else "mid"
    raise ModelDirProblem(
        root,
        f"not a Helios pipeline: model_index.json names {pipeline}, not HeliosPipeline or "
        "HeliosPyramidPipeline",
    )
