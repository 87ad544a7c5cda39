"""Schema migrations through Alembic, from code: `factory db upgrade` and the embedded path.

Alembic is imported only to migrate: checking that the schema is current (every command that
opens the factory does) reads the migration files and the `alembic_version` table directly,
which costs a few milliseconds instead of a third of a second of imports (issue 35)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import inspect, text

import migrations
from factory.db.session import Database
from factory.errors import SchemaNotReady

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR = Path(migrations.__file__).parent
_REVISION = re.compile(r'^(revision|down_revision)\s*(?::[^=]*)?=\s*(?:"([^"]*)"|None)', re.M)


def _config(database: Database) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", database.url.replace("%", "%%"))
    return config


def head_revision() -> str:
    """The newest migration: the one revision no other migration revises (the chain is linear;
    tests/integration/test_migrations.py holds this to Alembic's own answer)."""
    revisions: set[str] = set()
    revised: set[str] = set()
    for path in (MIGRATIONS_DIR / "versions").glob("*.py"):
        found = dict(_REVISION.findall(path.read_text()))
        if found.get("revision"):
            revisions.add(found["revision"])
        if found.get("down_revision"):
            revised.add(found["down_revision"])
    heads = revisions - revised
    assert len(heads) == 1, f"migrations/versions has {len(heads)} heads: {sorted(heads)}"
    return heads.pop()


def current_revision(database: Database) -> str | None:
    with database.connect() as conn:
        if not inspect(conn).has_table("alembic_version"):
            return None
        rows = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    return rows[0] if len(rows) == 1 else None


def upgrade(database: Database, revision: str = "head") -> None:
    from alembic import command

    with database.transaction() as conn:
        config = _config(database)
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


def downgrade(database: Database, revision: str) -> None:
    from alembic import command

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
