"""The readers of single environment variables that every settings section shares: each
names its variable in the error it raises (docs/configuration.md lists the variables)."""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from factory.errors import ConfigError

_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(?:\d+[smhdw])+")
_N = TypeVar("_N", int, float)


def positive_int(env: Mapping[str, str], name: str, default: int, unit: str = "seconds") -> int:
    return whole_number(env, name, default, unit, zero_allowed=False)


def whole_seconds(env: Mapping[str, str], name: str, default: int) -> int:
    """Seconds, where 0 means no limit."""
    return whole_number(env, name, default, "seconds", zero_allowed=True)


def whole_number(
    env: Mapping[str, str], name: str, default: int, unit: str, *, zero_allowed: bool
) -> int:
    value = read_number(env, name, default, int, f"a whole number of {unit}")
    if value < 0 or (value == 0 and not zero_allowed):
        need = ">= 0 (0: no limit)" if zero_allowed else "> 0"
        raise ConfigError(f"must be {need}, got {value}", field=name)
    return value


def parse_duration(raw: str, name: str) -> int:
    """Seconds from `7d`, `36h`, `90m`, `45s`, `1w`, `1d12h` or `0`. A bare number other
    than 0 is refused: `7` could mean seven days as easily as seven seconds."""
    text = raw.strip().lower()
    if text == "0":
        return 0
    if not _DURATION.fullmatch(text):
        raise ConfigError(
            f"must be a duration like 7d, 36h, 90m, 45s (or 0), got {raw!r}", field=name
        )
    return sum(
        int(amount) * _DURATION_UNITS[unit] for amount, unit in re.findall(r"(\d+)([smhdw])", text)
    )


def fraction(env: Mapping[str, str], name: str, default: float) -> float:
    value = finite_number(env, name, default, "a number from 0 to 1")
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"must be from 0 to 1, got {value}", field=name)
    return value


def finite_number(env: Mapping[str, str], name: str, default: float, what: str) -> float:
    value = read_number(env, name, default, float, what)
    if value != value or abs(value) == float("inf"):
        raise ConfigError(f"must be a finite number, got {env[name]!r}", field=name)
    return value


def read_number(
    env: Mapping[str, str], name: str, default: _N, parse: Callable[[str], _N], what: str
) -> _N:
    """The variable parsed by `parse`, or the default when it is unset or empty."""
    raw = (env.get(name) or "").strip()
    if raw == "":
        return default
    try:
        return parse(raw)
    except ValueError:
        raise ConfigError(f"must be {what}, got {raw!r}", field=name) from None


def positive_float(env: Mapping[str, str], name: str, default: float) -> float:
    value = finite_number(env, name, default, "a number of seconds")
    if value <= 0:
        raise ConfigError(f"must be > 0, got {value}", field=name)
    return value


def flag(env: Mapping[str, str], name: str, *, default: bool = False) -> bool:
    raw = (env.get(name) or "").strip().lower()
    if raw == "":
        return default
    if raw in ("0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"must be 1/0, true/false, yes/no or on/off, got {raw!r}", field=name)


def choice(env: Mapping[str, str], name: str, allowed: tuple[str, ...]) -> str:
    raw = (env.get(name) or allowed[0]).strip().lower()
    if raw not in allowed:
        raise ConfigError(f"must be one of {', '.join(allowed)}, got {raw!r}", field=name)
    return raw


def optional_path(env: Mapping[str, str], name: str) -> Path | None:
    raw = env.get(name) or ""
    return Path(raw).expanduser() if raw else None


def existing_file(env: Mapping[str, str], name: str) -> Path | None:
    """The file the variable names, which this process can read: a key written 0600 for
    root is named here with its fix, not found out at the first delivery as an outage."""
    path = optional_path(env, name)
    if path is None:
        return None
    unreadable = (f"{path} cannot be read by uid {os.getuid()} (the user this runs as): give "
                  f"it to that user, e.g. chown factory: {path} && chmod 600 {path}")  # fmt: skip
    try:
        if not path.is_file():  # (a pipe or a device would block the open below)
            raise ConfigError(f"{path} is not a readable file", field=name)
        with open(path, "rb"):
            pass
    except PermissionError:  # the file's mode, or a folder on its way that may not be entered
        raise ConfigError(unreadable, field=name) from None
    except OSError as exc:
        raise ConfigError(f"{path} is not a readable file ({exc.strerror})", field=name) from None
    return path


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
