"""The database handle: one engine per process, transactions as context managers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import InternalError, OperationalError

from factory.errors import RetryableError

_AFTER_COMMIT = "factory.after_commit"


class Database:
    """``statement_timeout`` and ``idle_timeout`` (seconds, PostgreSQL only): no statement
    waits longer than that for a lock or anything else, and a session left idle inside a
    transaction (a frozen worker holding a row lock) is ended by the server, so it cannot
    hide a job from the sweeper or block cancel and requeue for ever."""

    def __init__(self, url: str, *, statement_timeout: int = 0, idle_timeout: int = 0) -> None:
        self.url = url
        self.engine = _make_engine(url, statement_timeout, idle_timeout)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A connection in a transaction: committed on success, rolled back on any error.
        What `after_commit` queued on it runs once the commit is done, never after a
        rollback."""
        queued: list[Callable[[], None]] = []
        try:
            with self.engine.begin() as conn:
                conn.info[_AFTER_COMMIT] = queued
                try:
                    yield conn
                finally:
                    conn.info.pop(_AFTER_COMMIT, None)
        except (OperationalError, InternalError) as exc:
            # InternalError: e.g. a read-only transaction during a failover, a session the
            # server ended (idle_in_transaction_session_timeout): the next try may work.
            raise RetryableError(f"database unavailable: {_first_line(exc)}") from exc
        for then in queued:
            then()

    @staticmethod
    def after_commit(conn: Connection, then: Callable[[], None]) -> None:
        """Run `then` when the transaction `conn` belongs to has committed (what others may
        act on, such as an alert that reads the batch on another connection)."""
        conn.info[_AFTER_COMMIT].append(then)

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        """A plain connection (no transaction begun), for reads such as the schema revision."""
        try:
            with self.engine.connect() as conn:
                yield conn
        except OperationalError as exc:
            raise RetryableError(f"database unavailable: {_first_line(exc)}") from exc

    def dispose(self) -> None:
        self.engine.dispose()


def _make_engine(url: str, statement_timeout: int = 0, idle_timeout: int = 0) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 60})
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin_immediate)
        return engine
    options = [
        f"-c {name}={seconds * 1000}"
        for name, seconds in (
            ("statement_timeout", statement_timeout),
            ("idle_in_transaction_session_timeout", idle_timeout),
        )
        if seconds
    ]
    connect_args = {"options": " ".join(options)} if options else {}
    return create_engine(url, pool_pre_ping=True, connect_args=connect_args)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # Let pysqlite leave transactions to us, so BEGIN IMMEDIATE below takes the write lock
    # at the start (concurrent writers then queue on busy_timeout instead of deadlocking).
    dbapi_conn.isolation_level = None
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=60000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _sqlite_begin_immediate(conn: Connection) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def _first_line(exc: Exception) -> str:
    return (
        str(getattr(exc, "orig", exc)).strip().splitlines()[0] if str(exc) else type(exc).__name__
    )
