"""Where a manifest may make the factory read: the operator's allowed roots and buckets.

A manifest author names assets and model directories; without limits a manifest could make
every worker read `/proc/self/environ`, a key file, or any bucket the factory's credentials
reach. Three settings (docs/security.md):

- FACTORY_ASSET_ROOTS: folders a `file://` asset may be in (none by default: `file://`
  assets are refused until the operator names a folder);
- FACTORY_MODEL_ROOTS: folders a model directory may be in (default `/models` and
  FACTORY_HOME/models);
- FACTORY_ASSET_BUCKETS: buckets an `s3://` asset may be in (default: the store's bucket).

Paths are compared after resolving links and `..`, so a link inside a root that points out
of it is refused too. The same check runs at validate/submit (exit 2, naming the field) and
on the worker before a file is opened (a spec changed in the database is refused there).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from factory.errors import ConfigError, PermanentError

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


class OutsideConfinement(PermanentError):
    """A spec names a file, folder or bucket outside what the operator allowed."""


@dataclass(frozen=True)
class Confinement:
    asset_roots: tuple[Path, ...] = ()
    model_roots: tuple[Path, ...] = (Path("/models"),)
    asset_buckets: tuple[str, ...] = ()

    def asset_problem(self, reference: str) -> str | None:
        """Why an asset reference is not allowed, or None. Store keys (no scheme) and paths
        beside the manifest (`./`) are the factory's own and always allowed."""
        if reference.startswith("file://"):
            path = Path(unquote(urlparse(reference).path))
            if not self.asset_roots:
                return (f"{reference}: file:// assets are refused unless FACTORY_ASSET_ROOTS "
                        "names the folders they may be in")  # fmt: skip
            if not _inside(path, self.asset_roots):
                return (f"{reference} is outside the allowed asset folders "
                        f"(FACTORY_ASSET_ROOTS: {_names(self.asset_roots)})")  # fmt: skip
        elif reference.startswith("s3://"):
            bucket = urlparse(reference).netloc
            if bucket not in self.asset_buckets:
                allowed = ", ".join(self.asset_buckets) or "none"
                return (f"{reference}: bucket {bucket!r} is not allowed "
                        f"(FACTORY_ASSET_BUCKETS: {allowed})")  # fmt: skip
        return None

    def model_problem(self, path: str) -> str | None:
        if not _inside(Path(path), self.model_roots):
            return (f"{path} is outside the allowed model folders "
                    f"(FACTORY_MODEL_ROOTS: {_names(self.model_roots)})")  # fmt: skip
        return None

    def check_asset(self, reference: str) -> None:
        problem = self.asset_problem(reference)
        if problem:
            raise OutsideConfinement(problem)

    def check_model(self, path: str | None) -> None:
        problem = self.model_problem(path) if path else None
        if problem:
            raise OutsideConfinement(problem)


def _inside(path: Path, roots: tuple[Path, ...]) -> bool:
    if not path.is_absolute():
        return False
    real = Path(os.path.realpath(path))
    return any(real.is_relative_to(os.path.realpath(root)) for root in roots)


def _names(roots: tuple[Path, ...]) -> str:
    return ":".join(str(root) for root in roots) or "none"


def confinement_from_env(
    env: Mapping[str, str], home: Path, store_bucket: str | None
) -> Confinement:
    model_default = (Path("/models"), home / "models")
    return Confinement(
        asset_roots=_roots(env, "FACTORY_ASSET_ROOTS", ()),
        model_roots=_roots(env, "FACTORY_MODEL_ROOTS", model_default),
        asset_buckets=_buckets(env, store_bucket),
    )


def _roots(env: Mapping[str, str], name: str, default: tuple[Path, ...]) -> tuple[Path, ...]:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    roots = []
    for part in raw.split(":"):
        part = part.strip()
        if not part:
            continue
        root = Path(part).expanduser()
        if not root.is_absolute():
            raise ConfigError(f"{part!r} must be an absolute folder path", field=name)
        if root == Path("/"):
            raise ConfigError("'/' would allow every file; name the folders", field=name)
        roots.append(root)
    return tuple(roots)


def _buckets(env: Mapping[str, str], store_bucket: str | None) -> tuple[str, ...]:
    name = "FACTORY_ASSET_BUCKETS"
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return (store_bucket,) if store_bucket else ()
    buckets = tuple(dict.fromkeys(b.strip() for b in raw.split(",") if b.strip()))
    for bucket in buckets:
        if not _BUCKET.match(bucket):
            raise ConfigError(f"{bucket!r} is not a bucket name", field=name)
    return buckets
