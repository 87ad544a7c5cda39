"""Settings, built once from FACTORY_* variables; nothing else in the factory reads the environment.

Embedded defaults (no server needed): a SQLite database and a file store under FACTORY_HOME,
no broker (stages run in-process), no Redis (idempotency by the database constraint alone).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from factory.errors import ConfigError
from factory.generate.memory import MemoryPolicy
from factory.qc.thresholds import ENV_NAMES, QcThresholds

_SUPPORTED_DATABASES = ("sqlite", "postgresql")
_SUPPORTED_STORES = ("file", "s3")


@dataclass(frozen=True)
class Settings:
    home: Path
    database_url: str
    broker_url: str | None
    store_url: str
    redis_url: str | None
    stale_after: int
    sweep_every: int
    submit_token_ttl: int
    max_recoveries: int
    heartbeat_every: int
    segment_time_limit: int
    log_format: str
    attention_backend: str | None
    drift_factor: float
    vae_tiling: bool = False
    group_offload: str = "off"
    layerwise_casting: str = "off"
    text_encoder_device: str = "cpu"
    embedding_cache: str = "store"
    embedding_cache_bytes: int = 4 << 30
    qc: QcThresholds = field(default_factory=QcThresholds)

    @property
    def memory_policy(self) -> MemoryPolicy:
        return MemoryPolicy(self.vae_tiling, self.group_offload, self.layerwise_casting)

    @property
    def is_embedded_database(self) -> bool:
        return self.database_url.startswith("sqlite")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        home = Path(env.get("FACTORY_HOME") or Path.home() / ".factory").expanduser()
        database_url = env.get("FACTORY_DATABASE_URL") or f"sqlite:///{home / 'factory.db'}"
        store_url = env.get("FACTORY_STORE_URL") or (home / "store").as_uri()
        settings = cls(
            home=home,
            database_url=database_url,
            broker_url=env.get("FACTORY_BROKER_URL") or None,
            store_url=store_url,
            redis_url=env.get("FACTORY_REDIS_URL") or None,
            stale_after=_positive_int(env, "FACTORY_STALE_AFTER", 300),
            sweep_every=_positive_int(env, "FACTORY_SWEEP_EVERY", 30),
            submit_token_ttl=_positive_int(env, "FACTORY_SUBMIT_TOKEN_TTL", 600),
            max_recoveries=_positive_int(env, "FACTORY_MAX_RECOVERIES", 3),
            heartbeat_every=_positive_int(env, "FACTORY_HEARTBEAT_EVERY", 30),
            segment_time_limit=_positive_int(env, "FACTORY_SEGMENT_TIME_LIMIT", 1800),
            log_format=env.get("FACTORY_LOG_FORMAT") or "text",
            attention_backend=env.get("FACTORY_ATTENTION_BACKEND") or None,
            drift_factor=_fraction(env, "FACTORY_DRIFT_FACTOR", 0.0),
            vae_tiling=_flag(env, "FACTORY_VAE_TILING"),
            group_offload=_choice(env, "FACTORY_GROUP_OFFLOAD", ("off", "block", "leaf")),
            layerwise_casting=_choice(env, "FACTORY_LAYERWISE_CASTING", ("off", "fp8")),
            text_encoder_device=env.get("FACTORY_TEXT_ENCODER_DEVICE") or "cpu",
            embedding_cache=_choice(env, "FACTORY_EMBEDDING_CACHE", ("store", "redis", "off")),
            embedding_cache_bytes=_positive_int(
                env, "FACTORY_EMBEDDING_CACHE_BYTES", 4 << 30, unit="bytes"
            ),
            qc=_qc_thresholds(env),
        )
        settings._check_schemes()
        return settings

    def _check_schemes(self) -> None:
        scheme = self.database_url.split(":", 1)[0].split("+", 1)[0]
        if scheme not in _SUPPORTED_DATABASES:
            raise ConfigError(
                f"scheme {scheme!r} is not supported; use one of {', '.join(_SUPPORTED_DATABASES)}",
                field="FACTORY_DATABASE_URL",
            )
        store_scheme = self.store_url.split(":", 1)[0]
        if store_scheme not in _SUPPORTED_STORES:
            raise ConfigError(
                f"scheme {store_scheme!r} is not supported; use file:///path or s3://bucket/prefix",
                field="FACTORY_STORE_URL",
            )
        if self.attention_backend not in (None, "_flash_3", "flash", "native"):
            raise ConfigError(
                "must be _flash_3, flash or native", field="FACTORY_ATTENTION_BACKEND"
            )
        if self.embedding_cache == "redis" and not self.redis_url:
            raise ConfigError(
                "is redis but FACTORY_REDIS_URL is not set", field="FACTORY_EMBEDDING_CACHE"
            )
        if not self.text_encoder_device.startswith(("cpu", "cuda")):
            raise ConfigError(
                f"must be cpu or cuda[:N], got {self.text_encoder_device!r}",
                field="FACTORY_TEXT_ENCODER_DEVICE",
            )
        if self.log_format not in ("text", "json"):
            raise ConfigError(
                f"must be text or json, got {self.log_format!r}", field="FACTORY_LOG_FORMAT"
            )
        for name, url in (
            ("FACTORY_REDIS_URL", self.redis_url),
            ("FACTORY_BROKER_URL", self.broker_url),
        ):
            if url and not url.startswith(("redis://", "rediss://", "unix://")):
                raise ConfigError("must be a redis:// or rediss:// URL", field=name)


def _positive_int(env: Mapping[str, str], name: str, default: int, unit: str = "seconds") -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"must be a whole number of {unit}, got {raw!r}", field=name) from None
    if value <= 0:
        raise ConfigError(f"must be > 0, got {value}", field=name)
    return value


def _fraction(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"must be a number from 0 to 1, got {raw!r}", field=name) from None
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"must be from 0 to 1, got {value}", field=name)
    return value


def _flag(env: Mapping[str, str], name: str) -> bool:
    raw = (env.get(name) or "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"must be 1/0, true/false, yes/no or on/off, got {raw!r}", field=name)


def _choice(env: Mapping[str, str], name: str, allowed: tuple[str, ...]) -> str:
    raw = (env.get(name) or allowed[0]).strip().lower()
    if raw not in allowed:
        raise ConfigError(f"must be one of {', '.join(allowed)}, got {raw!r}", field=name)
    return raw


def _qc_thresholds(env: Mapping[str, str]) -> QcThresholds:
    values: dict[str, float | int] = {}
    for field_name, name in ENV_NAMES.items():
        raw = env.get(name)
        if raw is None or raw == "":
            continue
        default = getattr(QcThresholds, field_name)
        try:
            value = int(raw) if isinstance(default, int) else float(raw)
        except ValueError:
            raise ConfigError(f"must be a number, got {raw!r}", field=name) from None
        if value < 0 or (value != value) or value == float("inf"):
            raise ConfigError(f"must be a finite number >= 0, got {raw!r}", field=name)
        values[field_name] = value
    return QcThresholds(**values)
