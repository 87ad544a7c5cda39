"""Alembic environment: one history for PostgreSQL and SQLite."""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection

from factory.config import Settings
from factory.db.models import metadata
from factory.db.session import Database

config = context.config
if config.config_file_name and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name)


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def _url() -> str:
    return config.get_main_option("sqlalchemy.url") or Settings.from_env().database_url


if context.is_offline_mode():
    context.configure(url=_url(), target_metadata=metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
elif (given := config.attributes.get("connection")) is not None:
    _run(given)
else:
    database = Database(_url())
    try:
        with database.engine.connect() as connection:
            _run(connection)
            connection.commit()
    finally:
        database.dispose()
