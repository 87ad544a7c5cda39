"""The one Alembic history upgrades and downgrades on PostgreSQL and on SQLite."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from factory.db import migrate
from factory.db.models import metadata
from factory.db.session import Database
from factory.errors import SchemaNotReady

TABLES = {"batches", "jobs", "job_events", "prompt_embeddings", "gpu_nodes"}


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
