"""job_versions: delivered versions as append-only records, and `jobs.version`, the one that
is published now (moved out of `progress.deliver` and `progress.versions`, docs/jobs.md)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04
"""

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

from factory.db.models import Json, UtcDateTime

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

REDO_KEYS = ("range", "segments", "join", "chunks")


def _prefix(job_id: str, version: int) -> str:
    batch, _, video = job_id.partition(".")
    return f"{batch}/{video}" if version <= 1 else f"{batch}/{video}/v{version}"


def upgrade() -> None:
    # Plain ALTER TABLE … ADD COLUMN: no rebuild of a table others refer to.
    op.add_column("jobs", sa.Column("version", sa.Integer(), nullable=True))
    table = op.create_table(
        "job_versions",
        sa.Column("job_id", sa.String(128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("prefix", sa.Text(), nullable=False),
        sa.Column("outputs", Json, nullable=True),
        sa.Column("segments_from", Json, nullable=True),
        sa.Column("detail", Json, nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("reserved_at", UtcDateTime(), nullable=False),
        sa.Column("delivered_at", UtcDateTime(), nullable=True),
        sa.CheckConstraint("state IN ('pending', 'delivered')", name="ck_job_versions_state"),
        sa.CheckConstraint("version >= 1", name="ck_job_versions_version"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.job_id"], name="fk_job_versions_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "version", name="pk_job_versions"),
    )
    conn = op.get_bind()
    jobs = sa.table(
        "jobs",
        sa.column("job_id", sa.String),
        sa.column("progress", Json),
        sa.column("attempt", sa.Integer),
        sa.column("version", sa.Integer),
    )
    rows = conn.execute(sa.select(jobs.c.job_id, jobs.c.progress, jobs.c.attempt)).all()
    for job_id, progress, attempt in rows:
        deliver = progress.get("deliver") or {}
        entries = {int(v["version"]): v for v in progress.get("versions", [])}
        if deliver.get("outputs") and not entries:
            entries[int(deliver.get("version", 1))] = {"outputs": deliver["outputs"]}
        if not entries:
            continue
        for version, entry in sorted(entries.items()):
            at = entry.get("at")
            when = datetime.fromisoformat(at) if at else datetime.now(UTC)
            when = when if when.tzinfo else when.replace(tzinfo=UTC)
            detail = {"kind": "redo" if "range" in entry else "first"}
            detail |= {k: entry[k] for k in REDO_KEYS if k in entry}
            detail |= {"reason": entry.get("reason", "")}
            conn.execute(
                table.insert().values(
                    job_id=job_id, version=version, attempt=int(attempt), state="delivered",
                    prefix=_prefix(job_id, version), outputs=entry.get("outputs", {}),
                    segments_from=None, detail=detail, actor=entry.get("actor", ""),
                    reserved_at=when, delivered_at=when,
                )
            )  # fmt: skip
        current = int(deliver.get("version", max(entries))) if deliver else max(entries)
        slim = {k: v for k, v in progress.items() if k not in ("deliver", "versions")}
        conn.execute(
            jobs.update().where(jobs.c.job_id == job_id).values(progress=slim, version=current)
        )


def downgrade() -> None:
    conn = op.get_bind()
    versions = sa.table(
        "job_versions",
        sa.column("job_id", sa.String),
        sa.column("version", sa.Integer),
        sa.column("state", sa.String),
        sa.column("outputs", Json),
        sa.column("detail", Json),
        sa.column("actor", sa.Text),
        sa.column("delivered_at", UtcDateTime()),
    )
    jobs = sa.table(
        "jobs",
        sa.column("job_id", sa.String),
        sa.column("progress", Json),
        sa.column("version", sa.Integer),
    )
    found: dict[str, list] = {}
    query = sa.select(versions).where(versions.c.state == "delivered").order_by("version")
    for row in conn.execute(query).mappings():
        detail = row["detail"] or {}
        entry = {"version": row["version"], "outputs": row["outputs"] or {},
                 "at": row["delivered_at"].isoformat(timespec="seconds")}  # fmt: skip
        if detail.get("kind") == "redo":
            entry |= {k: detail[k] for k in REDO_KEYS if k in detail}
            entry |= {"reason": detail.get("reason", ""), "actor": row["actor"]}
        found.setdefault(row["job_id"], []).append(entry)
    for job_id, progress, current in conn.execute(
        sa.select(jobs.c.job_id, jobs.c.progress, jobs.c.version)
    ).all():
        entries = found.get(job_id)
        if not entries or current is None:
            continue
        now = next(e for e in entries if e["version"] == current)
        restored = {**progress, "versions": entries,
                    "deliver": {"outputs": now["outputs"], "version": current}}  # fmt: skip
        conn.execute(jobs.update().where(jobs.c.job_id == job_id).values(progress=restored))
    op.drop_table("job_versions")
    op.execute("ALTER TABLE jobs DROP COLUMN version")
