"""The tables. Postgres in production, SQLite for the embedded path; one schema for both."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    false,
)
from sqlalchemy.dialects.postgresql import JSONB

from factory.stages import Stage

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

Json = JSON().with_variant(JSONB(), "postgresql")
Id = String(128)
STAGES_SQL = ", ".join(f"'{s.value}'" for s in Stage)


class Progress(TypeDecorator[dict]):
    """A job's progress JSON, with its `segments` (the indices done, a list in every reader's
    view) stored as ranges: `segment_ranges: [[0, 3000]]` instead of 3,000 numbers, so that
    recording a segment rewrites a document that does not grow with the video (the segment
    path appends to the last range in SQL, docs/jobs.md). Rows written before keep their
    list, which reads the same."""

    impl = JSON
    cache_ok = True

    def load_dialect_impl(self, dialect: Any) -> Any:
        return dialect.type_descriptor(JSONB() if dialect.name == "postgresql" else JSON())

    # An element of the document (`progress["gc"]` in a query) comes through here with its
    # own JSON value (a bool, a number, a list): only a whole document is converted.
    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        if not isinstance(value, dict) or "segments" not in value:
            return value
        stored = {k: v for k, v in value.items() if k != "segments"}
        stored["segment_ranges"] = segment_ranges(value["segments"])
        return stored

    def process_result_value(self, value: Any, dialect: Any) -> Any:
        if not isinstance(value, dict) or "segment_ranges" not in value:
            return value
        shown = {k: v for k, v in value.items() if k != "segment_ranges"}
        shown["segments"] = [i for start, end in value["segment_ranges"] for i in range(start, end)]
        return shown


def segment_ranges(indices: list[int]) -> list[list[int]]:
    """[0, 1, 2, 5, 6] -> [[0, 3], [5, 7]] (half-open ranges, sorted, unique)."""
    ranges: list[list[int]] = []
    for index in sorted(set(indices)):
        if ranges and ranges[-1][1] == index:
            ranges[-1][1] = index + 1
        else:
            ranges.append([index, index + 1])
    return ranges


class UtcDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC in and out; SQLite stores naive values, read back as UTC."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


batches = Table(
    "batches",
    metadata,
    Column("batch", Id, primary_key=True),
    Column("source", Text, nullable=False),  # the manifest path it was first submitted from
    Column("created_at", UtcDateTime, nullable=False),
    Column("notified_at", UtcDateTime, nullable=True),  # the batch-completion alert went out
    # `review: required`: QC-passed jobs wait in `review` until a person approves them
    Column("review", Boolean, nullable=False, default=False, server_default=false()),
    Column("review_notified_at", UtcDateTime, nullable=True),  # the waiting-for-review alert
)

jobs = Table(
    "jobs",
    metadata,
    Column("job_id", Id, primary_key=True),
    Column("batch", Id, ForeignKey("batches.batch"), nullable=False),
    Column("spec", Json, nullable=False),
    Column("spec_sha256", String(64), nullable=False),
    Column("stage", String(16), nullable=False),
    Column("progress", Progress, nullable=False),
    Column("attempt", Integer, nullable=False, default=0),
    Column("recoveries", Integer, nullable=False, default=0),  # automatic resumptions so far
    Column("claimed_by", String(255)),  # the worker holding the current attempt
    Column("stopped_stage", String(16)),  # where a failed or cancelled job stopped
    Column("last_error", Json),
    Column("trace_id", String(32), nullable=False),
    Column("heartbeat_at", UtcDateTime),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    # The delivered version that is published now (a row of `job_versions`); NULL until the
    # first delivery. It only moves forward, in the transaction that records that version.
    Column("version", Integer, nullable=True),
    CheckConstraint(f"stage IN ({STAGES_SQL})", name="stage"),
    CheckConstraint(f"stopped_stage IS NULL OR stopped_stage IN ({STAGES_SQL})", name="stopped"),
    CheckConstraint("attempt >= 0", name="attempt"),
    # The sweeper: active stages ordered by heartbeat. `factory jobs`: by batch, by stage.
    Index("ix_jobs_stage_heartbeat", "stage", "heartbeat_at"),
    Index("ix_jobs_batch_created", "batch", "created_at"),
    Index("ix_jobs_updated", "updated_at"),
)

job_events = Table(
    "job_events",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("job_id", Id, ForeignKey("jobs.job_id", ondelete="CASCADE"), nullable=False),
    Column("at", UtcDateTime, nullable=False),
    Column("stage", String(16), nullable=False),
    Column("event", String(32), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("detail", Json, nullable=False),
    Column("trace_id", String(32), nullable=False),
    Index("ix_job_events_job_id_id", "job_id", "id"),
)

# One row per segment made: the attempt whose files are the segment (store keys carry it),
# its generation time, the colour record the drift check reads, the seam score and the GPU
# memory. Kept out of `jobs.progress` so that recording a segment costs the same at segment
# 3,000 as at segment 10 (the progress JSON was rewritten whole at every checkpoint).
job_segments = Table(
    "job_segments",
    metadata,
    Column("job_id", Id, ForeignKey("jobs.job_id", ondelete="CASCADE"), primary_key=True),
    Column("segment", Integer, primary_key=True),
    Column("attempt", Integer, nullable=True),  # None: made before attempts named the files
    Column("seconds", Float(precision=53), nullable=False),
    Column("colour", Json, nullable=True),
    Column("seam", Json, nullable=True),  # the seam before this segment, with regenerations
    Column("memory", Json, nullable=True),
    Column("made_at", UtcDateTime, nullable=True),
    # The shot holder's lease token where one made it (part of its store keys), else None.
    Column("holder", String(64), nullable=True),
)

# Every delivery of a job, append-only: a number is taken (`pending`) before the delivery
# writes its files under a prefix of its own, and becomes `delivered` (and the job's current
# version) only after every file is stored and verified. A delivered row and its files are
# never written again; a pending row whose attempt died stays `pending` (the same run's next
# delivery takes it over); one whose redo was dropped (cancelled, rejected) becomes `dropped`
# and its number is never published.
job_versions = Table(
    "job_versions",
    metadata,
    Column("job_id", Id, ForeignKey("jobs.job_id", ondelete="CASCADE"), primary_key=True),
    Column("version", Integer, primary_key=True),
    Column("attempt", Integer, nullable=False),  # the deliver stage's attempt that took it
    Column("state", String(16), nullable=False),
    Column("prefix", Text, nullable=False),  # where its files live in the store
    Column("outputs", Json, nullable=True),  # {rendition|qc|contact|quality: url}
    Column("segments_from", Json, nullable=True),  # {segment: attempt} it was made from
    Column("detail", Json, nullable=False),  # kind, redo range/segments/join/chunks, reason
    Column("actor", Text, nullable=False, default=""),
    Column("reserved_at", UtcDateTime, nullable=False),
    Column("delivered_at", UtcDateTime, nullable=True),
    CheckConstraint("state IN ('pending', 'delivered', 'dropped')", name="state"),
    CheckConstraint("version >= 1", name="version"),
)

# The prompt-embedding cache's index (the blobs live in the store or in Redis). Rows stay
# after their blob is evicted: LRU-K keeps an entry's access history across re-admission.
prompt_embeddings = Table(
    "prompt_embeddings",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("model", Text, nullable=False),  # family:path, for `factory gpu report` and humans
    Column("size", BigInteger, nullable=False),
    Column("stored", Boolean, nullable=False),
    Column("last_access", Float(precision=53), nullable=False),  # epoch seconds
    Column("previous_access", Float(precision=53)),  # the access before; NULL: seen once
    Column("hits", Integer, nullable=False, default=0),
    Column("misses", Integer, nullable=False, default=0),
    Column("created_at", UtcDateTime, nullable=False),
    Index("ix_prompt_embeddings_stored", "stored"),
)

# What `factory worker --gpus auto` found on each node (nvidia-smi topo -m, parsed): the
# NVLink groups and NUMA affinity that multi-GPU work is placed by, and each GPU's queue.
gpu_nodes = Table(
    "gpu_nodes",
    metadata,
    Column("host", String(255), primary_key=True),
    Column("topology", Json, nullable=False),  # factory.gpu.topology.Topology.to_dict()
    Column("queues", Json, nullable=False),  # {"0": "gpu.<host>.0", …}
    Column("recorded_at", UtcDateTime, nullable=False),
)


ROLES = ("viewer", "operator", "admin")
ROLES_SQL = ", ".join(f"'{r}'" for r in ROLES)

# Access to the HTTP API and the console (factory.access): only a token's SHA-256 is kept.
api_tokens = Table(
    "api_tokens",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(64), nullable=False, unique=True),
    Column("role", String(16), nullable=False),
    Column("token_sha256", String(64), nullable=False, unique=True),
    Column("created_at", UtcDateTime, nullable=False),
    Column("last_used_at", UtcDateTime, nullable=True),
    Column("revoked_at", UtcDateTime, nullable=True),
    CheckConstraint(f"role IN ({ROLES_SQL})", name="role"),
)

# A console sign-in: the cookie holds the session's secret, the row its SHA-256, the token it
# came from (revoking the token ends its sessions at once) and the form (CSRF) secret.
console_sessions = Table(
    "console_sessions",
    metadata,
    Column("session_sha256", String(64), primary_key=True),
    Column("token_id", Integer, ForeignKey("api_tokens.id", ondelete="CASCADE"), nullable=False),
    Column("csrf", String(64), nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("expires_at", UtcDateTime, nullable=False),
    Index("ix_console_sessions_token_id", "token_id"),
)


def utcnow() -> datetime:
    return datetime.now(UTC)
