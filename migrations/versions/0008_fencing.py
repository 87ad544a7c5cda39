"""Fencing (issue 48): a dropped redo's reserved version is marked `dropped` (its number is
never published), and a segment made by a shot's holder names that holder (`holder`: its
lease token, part of the segment's store keys, so two holders never write one object)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("job_segments", sa.Column("holder", sa.String(64), nullable=True))
    # SQLite cannot change a CHECK in place: the batch rebuilds job_versions (nothing refers
    # to it); PostgreSQL drops and adds the constraint.
    with op.batch_alter_table("job_versions") as batch:
        batch.drop_constraint("ck_job_versions_state", type_="check")
        batch.create_check_constraint(
            "ck_job_versions_state", "state IN ('pending', 'delivered', 'dropped')"
        )


def downgrade() -> None:
    op.execute("UPDATE job_versions SET state = 'pending' WHERE state = 'dropped'")
    with op.batch_alter_table("job_versions") as batch:
        batch.drop_constraint("ck_job_versions_state", type_="check")
        batch.create_check_constraint("ck_job_versions_state", "state IN ('pending', 'delivered')")
    with op.batch_alter_table("job_segments") as batch:
        batch.drop_column("holder")
