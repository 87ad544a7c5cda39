"""The one Alembic history upgrades and downgrades on PostgreSQL and on SQLite."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from factory.db import migrate
from factory.db.models import metadata
from factory.db.session import Database
from factory.db.state import JobStateMachine
from factory.errors import SchemaNotReady

pytestmark = pytest.mark.fast  # in-process, seconds: part of `scripts/test --fast`

TABLES = {"batches", "jobs", "job_events", "job_segments", "prompt_embeddings", "gpu_nodes",
          "api_tokens", "console_sessions", "job_versions"}  # fmt: skip


def tables(database: Database) -> set[str]:
    return set(inspect(database.engine).get_table_names()) - {"alembic_version"}


def test_upgrade_downgrade_upgrade(any_url: str):
    database = Database(any_url)
    assert migrate.current_revision(database) is None
    migrate.upgrade(database)
    assert migrate.current_revision(database) == migrate.head_revision()
    assert tables(database) == TABLES
    indexes = {ix["name"] for ix in inspect(database.engine).get_indexes("jobs")}
    assert {"ix_jobs_stage_heartbeat", "ix_jobs_batch_created"} <= indexes
    migrate.downgrade(database, "base")
    assert migrate.current_revision(database) is None
    assert tables(database) == set()
    migrate.upgrade(database)
    assert tables(database) == TABLES
    database.dispose()


def test_the_schema_check_reads_what_alembic_says_without_importing_it(any_url: str):
    """`current_revision` and `head_revision` (every command that opens the factory asks them)
    answer as Alembic does, from the table and the migration files."""
    from alembic.script import ScriptDirectory

    assert (
        migrate.head_revision() == ScriptDirectory(str(migrate.MIGRATIONS_DIR)).get_current_head()
    )
    database = Database(any_url)

    def alembic_says() -> str | None:
        with database.engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()

    assert migrate.current_revision(database) is None and alembic_says() is None
    for revision in ("0003", "head", "0006"):
        if revision == "0006":
            migrate.downgrade(database, revision)
        else:
            migrate.upgrade(database, revision)
        assert migrate.current_revision(database) == alembic_says() is not None
    database.dispose()


def test_migrations_match_the_models(any_url: str):
    """Autogenerate finds nothing to change: the history and factory/db/models.py agree."""
    database = Database(any_url)
    migrate.upgrade(database)
    with database.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(context, metadata)
    assert diff == []
    database.dispose()


def test_ensure_schema_upgrades_embedded_and_refuses_otherwise(any_url: str):
    database = Database(any_url)
    with pytest.raises(SchemaNotReady, match="factory db upgrade"):
        migrate.ensure_schema(database, auto_upgrade=False)
    migrate.ensure_schema(database, auto_upgrade=True)
    assert migrate.current_revision(database) == migrate.head_revision()
    migrate.ensure_schema(database, auto_upgrade=False)
    database.dispose()


LEGACY_PROGRESS = {
    "frame": 30,
    "frames_total": 40,
    "segments": [0, 1],
    "segments_total": 3,
    "segment_seconds": {"0": 1.5, "1": 2.5},
    "segment_attempts": {"0": 3, "1": 4},
    "colour": {"0": {"spread": 40.0}, "1": {"spread": 41.0}},
    "seams": {"1": {"seam": 1, "passed": True, "regenerations": 0}},
    "timings": {},
}


def _old_job(database: Database, stage: str, attempt: int, progress: dict) -> None:
    """Job `old.v` of batch `old` as code before a migration wrote it."""
    import json

    with database.transaction() as conn:
        conn.execute(text("INSERT INTO batches (batch, source, created_at) "
                          "VALUES ('old', 'm.yaml', '2026-12-01 00:00:00+00')"))  # fmt: skip
        conn.execute(
            text(
                "INSERT INTO jobs (job_id, batch, spec, spec_sha256, stage, progress, attempt, "
                "recoveries, trace_id, created_at, updated_at) VALUES ('old.v', 'old', '{}', "
                "'x', :stage, :p, :attempt, 0, 't', '2026-12-01 00:00:00+00', "
                "'2026-12-01 00:00:00+00')"
            ),
            {"p": json.dumps(progress), "stage": stage, "attempt": attempt},
        )


def _upgraded_old_job(
    any_url: str, before: str, stage: str, attempt: int, progress: dict
) -> tuple[Database, JobStateMachine]:
    """Job `old.v` (_old_job) written at revision BEFORE, then the database upgraded to head."""
    database = Database(any_url)
    migrate.upgrade(database, before)
    _old_job(database, stage, attempt, progress)
    migrate.upgrade(database)
    return database, JobStateMachine(database)


def _progress_downgraded(database: Database, revision: str) -> dict:
    """The one job's progress as it is in the database after a downgrade to REVISION."""
    import json

    migrate.downgrade(database, revision)
    with database.transaction() as conn:
        raw = conn.execute(text("SELECT progress FROM jobs")).scalar_one()
    return json.loads(raw) if isinstance(raw, str) else raw


def test_0005_moves_per_segment_records_out_of_progress_and_back(any_url: str):
    """A job made before 0005 keeps every segment's record: as rows after the upgrade (its
    progress slimmed), back in its progress after a downgrade."""
    database, machine = _upgraded_old_job(any_url, "0004", "generate", 4, LEGACY_PROGRESS)
    made = machine.segments("old.v")
    assert [(r.index, r.attempt, r.seconds) for r in made.values()] == [(0, 3, 1.5), (1, 4, 2.5)]
    assert made[0].colour == {"spread": 40.0} and made[0].seam is None
    assert made[1].seam == {"seam": 1, "passed": True, "regenerations": 0}
    progress = machine.get("old.v").progress
    assert not {"segment_seconds", "segment_attempts", "colour", "seams"} & progress.keys()
    assert progress["segments"] == [0, 1]
    restored = _progress_downgraded(database, "0004")
    for key in ("segment_seconds", "segment_attempts", "colour", "seams"):
        assert restored[key] == LEGACY_PROGRESS[key], key
    database.dispose()


def test_0006_adds_review_and_downgrades_a_job_in_review_to_qc(any_url: str):
    """Before 0006 a stage `review` is refused by the database; after it, allowed; a downgrade
    puts jobs waiting for review back at qc (they passed it) instead of failing."""
    from sqlalchemy.exc import IntegrityError

    database = Database(any_url)
    migrate.upgrade(database, "0005")
    insert = text(
        "INSERT INTO jobs (job_id, batch, spec, spec_sha256, stage, progress, attempt, "
        "recoveries, trace_id, created_at, updated_at) VALUES (:id, 'old', '{}', 'x', :stage, "
        "'{\"segments\": []}', 1, 0, 't', '2026-12-01 00:00:00+00', '2026-12-01 00:00:00+00')"
    )
    with database.transaction() as conn:
        conn.execute(text("INSERT INTO batches (batch, source, created_at) "
                          "VALUES ('old', 'm.yaml', '2026-12-01 00:00:00+00')"))  # fmt: skip
        conn.execute(insert, {"id": "old.q", "stage": "qc"})  # rows that refer to the tables
        conn.execute(text("INSERT INTO job_events (job_id, at, stage, event, attempt, detail, "
                          "trace_id) VALUES ('old.q', '2026-12-01 00:00:00+00', 'qc', 'x', 1, "
                          "'{}', 't')"))  # fmt: skip
    with pytest.raises(IntegrityError), database.transaction() as conn:
        conn.execute(insert, {"id": "old.early", "stage": "review"})
    migrate.upgrade(database)
    with database.transaction() as conn:
        conn.execute(insert, {"id": "old.r", "stage": "review"})
        assert conn.execute(text("SELECT review FROM batches")).scalar_one() in (False, 0)
    migrate.downgrade(database, "0005")
    with database.transaction() as conn:
        stages = conn.execute(text("SELECT job_id, stage FROM jobs ORDER BY job_id")).all()
        assert [tuple(r) for r in stages] == [("old.q", "qc"), ("old.r", "qc")]
        assert conn.execute(text("SELECT count(*) FROM job_events")).scalar_one() == 1
    assert "api_tokens" not in tables(database)
    database.dispose()


DELIVERED_BEFORE_0007 = {
    "segment_ranges": [[0, 3]], "frame": 48, "frames_total": 48, "segments_total": 3,
    "deliver": {"version": 2, "outputs": {"mobile": "file:///s/old/v/v2/out/mobile.mp4"}},
    "versions": [
        {"version": 1, "outputs": {"mobile": "file:///s/old/v/out/mobile.mp4"},
         "at": "2026-12-01T00:00:00+00:00"},
        {"version": 2, "outputs": {"mobile": "file:///s/old/v/v2/out/mobile.mp4"},
         "at": "2026-12-02T00:00:00+00:00", "range": [1.0, 2.0], "segments": [1],
         "join": 2, "chunks": [0], "reason": "a gull", "actor": "cli:bob@h"},
    ],
}  # fmt: skip


def test_0007_moves_delivered_versions_into_rows_and_back(any_url: str):
    """A job delivered (and redone) before 0007 keeps its versions: as job_versions rows with
    `jobs.version` at the published one after the upgrade, back in its progress after a
    downgrade."""
    database, machine = _upgraded_old_job(any_url, "0006", "done", 9, DELIVERED_BEFORE_0007)
    job = machine.get("old.v")
    assert job.version == 2
    assert not {"deliver", "versions"} & job.progress.keys()
    found = machine.versions("old.v")
    assert [(v.version, v.state, v.prefix) for v in found] == [
        (1, "delivered", "old/v"), (2, "delivered", "old/v/v2")
    ]  # fmt: skip
    assert found[1].detail == {"kind": "redo", "range": [1.0, 2.0], "segments": [1],
                               "join": 2, "chunks": [0], "reason": "a gull"}  # fmt: skip
    assert found[1].actor == "cli:bob@h"
    assert machine.current_versions(["old.v"])["old.v"].outputs == {
        "mobile": "file:///s/old/v/v2/out/mobile.mp4"
    }
    restored = _progress_downgraded(database, "0006")
    assert restored["deliver"] == DELIVERED_BEFORE_0007["deliver"]
    assert [v["version"] for v in restored["versions"]] == [1, 2]
    assert restored["versions"][1]["reason"] == "a gull"
    assert "job_versions" not in tables(database)
    database.dispose()
