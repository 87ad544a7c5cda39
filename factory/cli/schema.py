"""`factory db`: the database schema (Alembic migrations)."""

from __future__ import annotations

import typer

from factory.cli import common
from factory.cli.common import out
from factory.db import migrate
from factory.db.session import Database

db_app = typer.Typer(help="Database schema (Alembic migrations).", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head", help="Target revision.")) -> None:
    """Apply migrations up to REVISION (default: the newest)."""
    database = Database(common.settings().database_url)
    before = migrate.current_revision(database)
    migrate.upgrade(database, revision)
    after = migrate.current_revision(database)
    out.print(f"database at revision {after} (was {before or 'empty'})")


@db_app.command("downgrade")
def db_downgrade(revision: str = typer.Argument(..., help="Target revision, or 'base'.")) -> None:
    """Revert migrations down to REVISION ('base' removes every table)."""
    database = Database(common.settings().database_url)
    migrate.downgrade(database, revision)
    out.print(f"database at revision {migrate.current_revision(database) or 'base (empty)'}")


@db_app.command("current")
def db_current() -> None:
    """Print the database's revision and the newest one this factory knows."""
    database = Database(common.settings().database_url)
    current = migrate.current_revision(database)
    out.print(f"current {current or 'none'}, head {migrate.head_revision()}")
