"""prompt_embeddings: the index of the prompt-embedding cache

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

from factory.db.models import UtcDateTime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "prompt_embeddings",
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("stored", sa.Boolean(), nullable=False),
        sa.Column("last_access", sa.Float(precision=53), nullable=False),
        sa.Column("previous_access", sa.Float(precision=53), nullable=True),
        sa.Column("hits", sa.Integer(), nullable=False),
        sa.Column("misses", sa.Integer(), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_prompt_embeddings"),
    )
    op.create_index("ix_prompt_embeddings_stored", "prompt_embeddings", ["stored"])


def downgrade() -> None:
    op.drop_index("ix_prompt_embeddings_stored", table_name="prompt_embeddings")
    op.drop_table("prompt_embeddings")
