"""batches, jobs and job_events

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

from factory.db.models import Json, UtcDateTime

# The stages as they were at 0001 (0006 adds `review`); frozen so that this revision
# always creates the same schema.
STAGES_SQL = ", ".join(
    f"'{s}'"
    for s in ("queued", "generate", "encode", "mux", "qc", "deliver", "done", "failed", "cancelled")
)
revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "batches",
        sa.Column("batch", sa.String(128), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("batch", name="pk_batches"),
    )
    op.create_table(
        "jobs",
        sa.Column("job_id", sa.String(128), nullable=False),
        sa.Column("batch", sa.String(128), nullable=False),
        sa.Column("spec", Json, nullable=False),
        sa.Column("spec_sha256", sa.String(64), nullable=False),
        sa.Column("stage", sa.String(16), nullable=False),
        sa.Column("progress", Json, nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("recoveries", sa.Integer(), nullable=False),
        sa.Column("claimed_by", sa.String(255), nullable=True),
        sa.Column("stopped_stage", sa.String(16), nullable=True),
        sa.Column("last_error", Json, nullable=True),
        sa.Column("trace_id", sa.String(32), nullable=False),
        sa.Column("heartbeat_at", UtcDateTime(), nullable=True),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.CheckConstraint(f"stage IN ({STAGES_SQL})", name="ck_jobs_stage"),
        sa.CheckConstraint(
            f"stopped_stage IS NULL OR stopped_stage IN ({STAGES_SQL})", name="ck_jobs_stopped"
        ),
        sa.CheckConstraint("attempt >= 0", name="ck_jobs_attempt"),
        sa.ForeignKeyConstraint(["batch"], ["batches.batch"], name="fk_jobs_batch_batches"),
        sa.PrimaryKeyConstraint("job_id", name="pk_jobs"),
    )
    op.create_index("ix_jobs_stage_heartbeat", "jobs", ["stage", "heartbeat_at"])
    op.create_index("ix_jobs_batch_created", "jobs", ["batch", "created_at"])
    op.create_index("ix_jobs_updated", "jobs", ["updated_at"])
    op.create_table(
        "job_events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("job_id", sa.String(128), nullable=False),
        sa.Column("at", UtcDateTime(), nullable=False),
        sa.Column("stage", sa.String(16), nullable=False),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("detail", Json, nullable=False),
        sa.Column("trace_id", sa.String(32), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.job_id"], name="fk_job_events_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_job_events"),
    )
    op.create_index("ix_job_events_job_id_id", "job_events", ["job_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_job_events_job_id_id", table_name="job_events")
    op.drop_table("job_events")
    op.drop_index("ix_jobs_updated", table_name="jobs")
    op.drop_index("ix_jobs_batch_created", table_name="jobs")
    op.drop_index("ix_jobs_stage_heartbeat", table_name="jobs")
    op.drop_table("jobs")
    op.drop_table("batches")
