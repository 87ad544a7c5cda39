"""gpu_nodes: each node's GPU topology (NVLink groups, NUMA) and its GPUs' queues

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

from factory.db.models import Json, UtcDateTime

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpu_nodes",
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("topology", Json, nullable=False),
        sa.Column("queues", Json, nullable=False),
        sa.Column("recorded_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("host", name="pk_gpu_nodes"),
    )


def downgrade() -> None:
    op.drop_table("gpu_nodes")
