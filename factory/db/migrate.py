"""Schema migrations through Alembic, from code: `factory db upgrade` and the embedded path."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

import migrations
from factory.db.session import Database
from factory.errors import SchemaNotReady

MIGRATIONS_DIR = Path(migrations.__file__).parent


def _config(database: Database) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", database.url.replace("%", "%%"))
    return config


def head_revision() -> str:
    head = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
    assert head is not None
    return head


def current_revision(database: Database) -> str | None:
    with database.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(database: Database, revision: str = "head") -> None:
    with database.transaction() as conn:
        config = _config(database)
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


def downgrade(database: Database, revision: str) -> None:
    with database.transaction() as conn:
        config = _config(database)
        config.attributes["connection"] = conn
        command.downgrade(config, revision)


def ensure_schema(database: Database, *, auto_upgrade: bool) -> None:
    """Make sure the schema is current: upgrade it (embedded SQLite) or say how to."""
    current = current_revision(database)
    if current == head_revision():
        return
    if auto_upgrade:
        upgrade(database)
        return
    state = "has no schema" if current is None else f"is at revision {current}"
    raise SchemaNotReady(
        f"the database {state}; this factory needs {head_revision()}: run `factory db upgrade`"
    )
