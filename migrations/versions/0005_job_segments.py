"""job_segments: one row per segment made (its attempt, seconds, colour, seam, GPU memory),
moved out of the job's progress JSON so that a checkpoint's cost stays flat over a long video

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

from factory.db.models import Json, UtcDateTime

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

MAPS = {  # progress key -> job_segments column
    "segment_attempts": "attempt",
    "segment_seconds": "seconds",
    "colour": "colour",
    "seams": "seam",
    "memory": "memory",
}


def upgrade() -> None:
    table = op.create_table(
        "job_segments",
        sa.Column("job_id", sa.String(128), nullable=False),
        sa.Column("segment", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=True),
        sa.Column("seconds", sa.Float(precision=53), nullable=False),
        sa.Column("colour", Json, nullable=True),
        sa.Column("seam", Json, nullable=True),
        sa.Column("memory", Json, nullable=True),
        sa.Column("made_at", UtcDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.job_id"], name="fk_job_segments_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "segment", name="pk_job_segments"),
    )
    conn = op.get_bind()
    jobs = sa.table("jobs", sa.column("job_id", sa.String), sa.column("progress", Json))
    for job_id, progress in conn.execute(sa.select(jobs.c.job_id, jobs.c.progress)).all():
        rows = []
        for index in progress.get("segments", []):
            key = str(index)
            row = {"job_id": job_id, "segment": int(index), "made_at": None}
            for name, column in MAPS.items():
                row[column] = progress.get(name, {}).get(key)
            row["seconds"] = float(row["seconds"] or 0.0)
            rows.append(row)
        if rows:
            conn.execute(table.insert(), rows)
        slim = {k: v for k, v in progress.items() if k not in MAPS}
        conn.execute(jobs.update().where(jobs.c.job_id == job_id).values(progress=slim))


def downgrade() -> None:
    conn = op.get_bind()
    table = sa.table(
        "job_segments",
        sa.column("job_id", sa.String),
        sa.column("segment", sa.Integer),
        sa.column("attempt", sa.Integer),
        sa.column("seconds", sa.Float),
        *(sa.column(c, Json) for c in ("colour", "seam", "memory")),
    )
    jobs = sa.table("jobs", sa.column("job_id", sa.String), sa.column("progress", Json))
    maps: dict[str, dict[str, dict]] = {}
    for row in conn.execute(sa.select(table)).mappings():
        job = maps.setdefault(row["job_id"], {name: {} for name in MAPS})
        for name, column in MAPS.items():
            if row[column] is not None:
                job[name][str(row["segment"])] = row[column]
    for job_id, progress in conn.execute(sa.select(jobs.c.job_id, jobs.c.progress)).all():
        restored = {**progress, **maps.get(job_id, {"segment_seconds": {}})}
        ranges = restored.pop("segment_ranges", None)  # stored as ranges since 0005
        if ranges is not None:
            restored["segments"] = [i for start, end in ranges for i in range(start, end)]
        conn.execute(jobs.update().where(jobs.c.job_id == job_id).values(progress=restored))
    op.drop_table("job_segments")
