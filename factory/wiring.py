"""Wiring: settings in, the database, the state machine (with the webhook alerts following
it) and the submit tokens out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from factory.config import Settings
from factory.db.migrate import ensure_schema
from factory.db.session import Database
from factory.db.state import JobStateMachine
from factory.infra import alerts

if TYPE_CHECKING:
    from factory.infra.idempotency import SubmitTokens


@dataclass
class Factory:
    settings: Settings
    database: Database
    jobs: JobStateMachine
    tokens: SubmitTokens | None

    @classmethod
    def open(cls, settings: Settings, *, check_schema: bool = True) -> Factory:
        database = Database(
            settings.database_url,
            statement_timeout=settings.db_statement_timeout,
            idle_timeout=settings.db_idle_timeout,
        )
        if check_schema:
            # The embedded SQLite database migrates itself; a shared one is upgraded on purpose.
            ensure_schema(database, auto_upgrade=settings.is_embedded_database)
        tokens = None
        if settings.redis_url:  # (redis is imported only where it is used)
            from factory.infra.idempotency import SubmitTokens

            tokens = SubmitTokens(settings.redis_url, settings.submit_token_ttl)
        machine = JobStateMachine(database)
        alerts.watch(machine, settings.webhook)
        return cls(settings, database, machine, tokens)

    def close(self) -> None:
        self.database.dispose()
