"""Review and access: the `review` stage, batches that require review, API tokens and console
sessions (the operations console and HTTP API, docs/console.md)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

from factory.db.models import UtcDateTime

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

BEFORE = ("queued", "generate", "encode", "mux", "qc", "deliver", "done", "failed", "cancelled")
AFTER = ("queued", "generate", "encode", "mux", "qc", "review", "deliver", "done", "failed",
         "cancelled")  # fmt: skip


def _stage_checks(before: tuple[str, ...], after: tuple[str, ...]) -> None:
    old, new = (", ".join(f"'{s}'" for s in stages) for stages in (before, after))
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        _sqlite_widen_checks(bind, old, new)
        return
    with op.batch_alter_table("jobs") as batch:
        batch.drop_constraint("ck_jobs_stage", type_="check")
        batch.drop_constraint("ck_jobs_stopped", type_="check")
        batch.create_check_constraint("ck_jobs_stage", f"stage IN ({new})")
        batch.create_check_constraint(
            "ck_jobs_stopped", f"stopped_stage IS NULL OR stopped_stage IN ({new})"
        )


def _sqlite_widen_checks(bind: sa.Connection, old: str, new: str) -> None:
    """SQLite cannot alter a CHECK; rebuilding `jobs` would drop a table that job_events and
    job_segments refer to, which its foreign keys refuse inside a transaction. The stage list
    is changed in the stored schema instead, SQLite's own procedure for a CHECK that the rows
    already satisfy (sqlite.org/lang_altertable.html, section 7)."""
    sql = bind.exec_driver_sql(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'jobs'"
    ).scalar_one()
    changed = sql.replace(f"IN ({old})", f"IN ({new})")
    if changed.count(f"IN ({new})") != 2:
        raise RuntimeError("jobs: the stage checks are not the ones this migration knows")
    version = bind.exec_driver_sql("PRAGMA schema_version").scalar_one()
    bind.exec_driver_sql("PRAGMA writable_schema = ON")
    bind.exec_driver_sql(
        "UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = 'jobs'", (changed,)
    )
    bind.exec_driver_sql(f"PRAGMA schema_version = {int(version) + 1}")
    bind.exec_driver_sql("PRAGMA writable_schema = OFF")


def upgrade() -> None:
    _stage_checks(BEFORE, AFTER)
    # Plain ALTER TABLE … ADD COLUMN: no rebuild of a table that jobs refer to.
    op.add_column(
        "batches", sa.Column("review", sa.Boolean(), nullable=False, server_default=sa.false())
    )
    op.add_column("batches", sa.Column("review_notified_at", UtcDateTime(), nullable=True))
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("token_sha256", sa.String(64), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("last_used_at", UtcDateTime(), nullable=True),
        sa.Column("revoked_at", UtcDateTime(), nullable=True),
        sa.CheckConstraint("role IN ('viewer', 'operator', 'admin')", name="ck_api_tokens_role"),
        sa.PrimaryKeyConstraint("id", name="pk_api_tokens"),
        sa.UniqueConstraint("name", name="uq_api_tokens_name"),
        sa.UniqueConstraint("token_sha256", name="uq_api_tokens_token_sha256"),
    )
    op.create_table(
        "console_sessions",
        sa.Column("session_sha256", sa.String(64), nullable=False),
        sa.Column("token_id", sa.Integer(), nullable=False),
        sa.Column("csrf", sa.String(64), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["token_id"],
            ["api_tokens.id"],
            name="fk_console_sessions_token_id_api_tokens",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("session_sha256", name="pk_console_sessions"),
    )
    op.create_index("ix_console_sessions_token_id", "console_sessions", ["token_id"])


def downgrade() -> None:
    op.drop_index("ix_console_sessions_token_id", table_name="console_sessions")
    op.drop_table("console_sessions")
    op.drop_table("api_tokens")
    # Plain ALTER TABLE … DROP COLUMN (SQLite 3.35+): no rebuild of a table jobs refer to.
    for column in ("review_notified_at", "review"):
        op.execute(f"ALTER TABLE batches DROP COLUMN {column}")
    # Jobs waiting for review go back to qc (they passed it; a requeue delivers them).
    op.execute("UPDATE jobs SET stage = 'qc' WHERE stage = 'review'")
    op.execute("UPDATE jobs SET stopped_stage = 'qc' WHERE stopped_stage = 'review'")
    _stage_checks(AFTER, BEFORE)
