"""Settings, built once from FACTORY_* variables; nothing else in the factory reads the environment.

The package holds every section of the settings: `Settings` here, the sections it carries
beside it (s3.py the store's connection, webhook.py the alerts, console.py the console and
API, health.py the worker's endpoint), and values.py, the readers of one variable that
they all share (so a number, a duration or a flag is read and refused the same way
everywhere).

Embedded defaults (no server needed): a SQLite database and a file store under FACTORY_HOME,
no broker (stages run in-process), no Redis (idempotency by the database constraint alone).
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from factory.config import console, health, s3, webhook
from factory.config.console import ConsoleSettings
from factory.config.health import HealthSettings
from factory.config.s3 import S3Settings, split_url
from factory.config.values import (
    choice,
    flag,
    fraction,
    optional_path,
    parse_duration,
    positive_float,
    positive_int,
    whole_seconds,
)
from factory.config.webhook import WebhookSettings
from factory.errors import ConfigError
from factory.generate.memory import MemoryPolicy
from factory.infra.confinement import Confinement, confinement_from_env
from factory.qc.thresholds import ENV_NAMES, QcThresholds

__all__ = ["ConsoleSettings", "HealthSettings", "S3Settings", "Settings", "WebhookSettings",
           "parse_duration"]  # fmt: skip

_SUPPORTED_DATABASES = ("sqlite", "postgresql")
_SUPPORTED_STORES = ("file", "s3")
DEFAULT_KEEP_INTERMEDIATES = 7 * 86400  # FACTORY_KEEP_INTERMEDIATES, 7d


@dataclass(frozen=True)
class Settings:
    home: Path
    database_url: str
    broker_url: str | None
    store_url: str
    redis_url: str | None
    stale_after: int
    lease_seconds: int
    sweep_every: int
    submit_token_ttl: int
    max_recoveries: int
    heartbeat_every: int
    segment_time_limit: int
    log_format: str
    attention_backend: str | None
    drift_factor: float
    vae_tiling: bool = False
    group_offload: str = "auto"
    layerwise_casting: str = "off"
    text_encoder_device: str = "cpu"
    embedding_cache: str = "store"
    embedding_cache_bytes: int = 4 << 30
    qc: QcThresholds = field(default_factory=QcThresholds)
    s3: S3Settings = field(default_factory=S3Settings)
    asset_cache_dir: Path | None = None  # None: FACTORY_HOME/assets
    asset_cache_bytes: int = 20 << 30
    node_name: str = "local"
    nodes: tuple[str, ...] = ("local",)  # every node that warms assets (consistent hashing)
    asset_replicas: int = 1
    gpu_memory_source: str = "nvml"  # nvml | none | file:/path (docs/operations.md)
    ready_gpu_memory: float = 0.95  # above this fraction in use a GPU worker takes no work
    readiness_every: float = 2.0
    nvidia_smi: str = "nvidia-smi"  # how `factory worker --gpus auto` reads the topology
    # a `factory worker --gpu N` that has no such GPU runs the GPU stages on the CPU
    # instead of refusing to start (FACTORY_WORKER_ALLOW_CPU=1, or --allow-cpu)
    worker_allow_cpu: bool = False
    webhook: WebhookSettings = field(default_factory=WebhookSettings)
    store_fsync: bool = True  # a file store syncs each write before a checkpoint records it
    give_up_after: int = 3600  # seconds of interruptions without progress before a job fails
    db_statement_timeout: int = 60  # seconds; PostgreSQL statement_timeout (0: none)
    db_idle_timeout: int = 60  # seconds; idle_in_transaction_session_timeout (0: none)
    # `factory gc`: intermediates of delivered jobs are kept this long (seconds; None: for ever)
    keep_intermediates: int | None = DEFAULT_KEEP_INTERMEDIATES
    # A GPU task makes its job's segments for this long (one checkpoint each) before it sends
    # the rest to its own queue; 0: one segment per task (docs/operations.md)
    gpu_task_seconds: int = 60
    health: HealthSettings = field(default_factory=HealthSettings)  # FACTORY_HEALTH_*
    console: ConsoleSettings = field(default_factory=ConsoleSettings)  # FACTORY_CONSOLE_*
    # allowed roots for file:// assets and model directories, allowed s3:// buckets
    confinement: Confinement = field(default_factory=Confinement)
    # What `factory worker` sets for the one worker process it starts: its own GPU queue
    # (FACTORY_GPU_QUEUE; none for a CPU worker), the GPU's NVML index (FACTORY_GPU_INDEX),
    # and the models it loads once (FACTORY_PRELOAD_MODELS, `family:path,...`)
    gpu_queue: str | None = None
    gpu_index: int | None = None
    preload_models: tuple[str, ...] = ()
    # `factory flower`: user:password, handed to Flower in its environment only
    flower_basic_auth: str = field(default="", repr=False)

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
            stale_after=positive_int(env, "FACTORY_STALE_AFTER", 300),
            lease_seconds=positive_int(env, "FACTORY_LEASE_SECONDS", 30),
            sweep_every=positive_int(env, "FACTORY_SWEEP_EVERY", 30),
            submit_token_ttl=positive_int(env, "FACTORY_SUBMIT_TOKEN_TTL", 600),
            max_recoveries=positive_int(env, "FACTORY_MAX_RECOVERIES", 3),
            heartbeat_every=positive_int(env, "FACTORY_HEARTBEAT_EVERY", 30),
            segment_time_limit=positive_int(env, "FACTORY_SEGMENT_TIME_LIMIT", 1800),
            log_format=env.get("FACTORY_LOG_FORMAT") or "text",
            attention_backend=env.get("FACTORY_ATTENTION_BACKEND") or None,
            drift_factor=fraction(env, "FACTORY_DRIFT_FACTOR", 0.0),
            vae_tiling=flag(env, "FACTORY_VAE_TILING"),
            group_offload=choice(env, "FACTORY_GROUP_OFFLOAD", ("auto", "off", "block", "leaf")),
            layerwise_casting=choice(env, "FACTORY_LAYERWISE_CASTING", ("off", "fp8")),
            text_encoder_device=env.get("FACTORY_TEXT_ENCODER_DEVICE") or "cpu",
            embedding_cache=choice(env, "FACTORY_EMBEDDING_CACHE", ("store", "redis", "off")),
            embedding_cache_bytes=positive_int(
                env, "FACTORY_EMBEDDING_CACHE_BYTES", 4 << 30, unit="bytes"
            ),
            qc=_qc_thresholds(env),
            s3=s3.parse(env, home),
            asset_cache_dir=optional_path(env, "FACTORY_ASSET_CACHE_DIR") or home / "assets",
            asset_cache_bytes=positive_int(
                env, "FACTORY_ASSET_CACHE_BYTES", 20 << 30, unit="bytes"
            ),
            asset_replicas=positive_int(env, "FACTORY_ASSET_REPLICAS", 1, unit="nodes"),
            gpu_memory_source=_memory_source(env),
            ready_gpu_memory=fraction(env, "FACTORY_READY_GPU_MEMORY", 0.95),
            readiness_every=positive_float(env, "FACTORY_READINESS_EVERY", 2.0),
            nvidia_smi=env.get("FACTORY_NVIDIA_SMI") or "nvidia-smi",
            worker_allow_cpu=flag(env, "FACTORY_WORKER_ALLOW_CPU"),
            gpu_queue=env.get("FACTORY_GPU_QUEUE") or None,
            gpu_index=_gpu_index(env),
            preload_models=tuple(filter(None, env.get("FACTORY_PRELOAD_MODELS", "").split(","))),
            flower_basic_auth=env.get("FACTORY_FLOWER_BASIC_AUTH", ""),
            webhook=webhook.parse(env),
            give_up_after=positive_int(env, "FACTORY_GIVE_UP_AFTER", 3600),
            store_fsync=flag(env, "FACTORY_STORE_FSYNC", default=True),
            db_statement_timeout=whole_seconds(env, "FACTORY_DB_STATEMENT_TIMEOUT", 60),
            db_idle_timeout=whole_seconds(env, "FACTORY_DB_IDLE_TIMEOUT", 60),
            keep_intermediates=_keep_intermediates(env),
            gpu_task_seconds=whole_seconds(env, "FACTORY_GPU_TASK_SECONDS", 60),
            health=health.parse(env),
            console=console.parse(env),
            confinement=confinement_from_env(env, home, _store_bucket(store_url)),
            **_nodes(env),
        )
        settings._check_schemes()
        if flag(env, "FACTORY_PRODUCTION"):
            _refuse_embedded(env)
        return settings

    def _check_schemes(self) -> None:
        if self.stale_after < 3 * self.heartbeat_every:
            raise ConfigError(
                f"must be at least 3 times FACTORY_HEARTBEAT_EVERY ({self.heartbeat_every} s), "
                f"got {self.stale_after}: a live job whose beat is a little late would be "
                "taken from its worker",
                field="FACTORY_STALE_AFTER",
            )
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
        if store_scheme == "s3":
            split_url(self.store_url)  # a bucket name S3 accepts, a prefix of safe parts
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


def _refuse_embedded(env: Mapping[str, str]) -> None:
    """A host that says it is production never falls back to the embedded factory: work put
    there (a batch in a SQLite file, assets in a local folder, no broker) reaches no worker."""
    database = env.get("FACTORY_DATABASE_URL") or ""
    store = env.get("FACTORY_STORE_URL") or ""
    for name, value, wrong in (
        ("FACTORY_DATABASE_URL", database, not database or database.startswith("sqlite")),
        ("FACTORY_STORE_URL", store, not store or store.startswith("file:")),
        ("FACTORY_BROKER_URL", env.get("FACTORY_BROKER_URL") or "", False),
    ):
        if wrong or not value:
            what = f"is {value!r}" if value else "is not set"
            raise ConfigError(
                f"this host is production, but {name} {what}: the embedded factory's "
                "default would be used, which no worker reads; set it in the env file "
                "(/etc/factory/factory.env)",
                field="FACTORY_PRODUCTION",
            )


def _store_bucket(store_url: str) -> str | None:
    return split_url(store_url)[0] if store_url.startswith("s3://") else None


def _keep_intermediates(env: Mapping[str, str]) -> int | None:
    name = "FACTORY_KEEP_INTERMEDIATES"
    raw = (env.get(name) or "").strip()
    if raw == "":
        return DEFAULT_KEEP_INTERMEDIATES
    if raw.lower() == "forever":
        return None
    return parse_duration(raw, name)


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


def _gpu_index(env: Mapping[str, str]) -> int | None:
    text = env.get("FACTORY_GPU_INDEX") or ""
    if text and not text.isdigit():
        raise ConfigError(f"must be a GPU's index (0, 1, ...), not {text!r}",
                          field="FACTORY_GPU_INDEX")  # fmt: skip
    return int(text) if text else None


_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def _nodes(env: Mapping[str, str]) -> dict[str, object]:
    node = env.get("FACTORY_NODE_NAME") or socket.gethostname().split(".")[0] or "local"
    if not _NODE.match(node):
        raise ConfigError(f"{node!r} must be of A-Z a-z 0-9 . _ -", field="FACTORY_NODE_NAME")
    raw = env.get("FACTORY_NODES") or ""
    nodes = tuple(dict.fromkeys(n.strip() for n in raw.split(",") if n.strip())) or (node,)
    for name in nodes:
        if not _NODE.match(name):
            raise ConfigError(f"{name!r} must be of A-Z a-z 0-9 . _ -", field="FACTORY_NODES")
    if node not in nodes:
        raise ConfigError(
            f"does not list this node ({node}, FACTORY_NODE_NAME): {', '.join(nodes)}",
            field="FACTORY_NODES",
        )
    return {"node_name": node, "nodes": nodes}


def _memory_source(env: Mapping[str, str]) -> str:
    raw = (env.get("FACTORY_GPU_MEMORY_SOURCE") or "nvml").strip()
    if raw in ("nvml", "none") or (raw.startswith("file:") and len(raw) > len("file:")):
        return raw
    raise ConfigError(
        f"must be nvml, none or file:/path, got {raw!r}", field="FACTORY_GPU_MEMORY_SOURCE"
    )
