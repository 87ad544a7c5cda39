"""Who may use the HTTP API and the console: named tokens with a role (viewer sees, operator
acts, admin also manages tokens), kept as SHA-256 only and shown once at creation; console
sessions made from a token at sign-in, each with its own form (CSRF) secret. Revoking a token
refuses it at once and ends its sessions (every request reads the token's row)."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from factory.db.models import ROLES, api_tokens, console_sessions, utcnow
from factory.db.session import Database
from factory.errors import BadInput

TOKEN_PREFIX = "fct_"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
_RANK = {role: rank for rank, role in enumerate(ROLES)}
LAST_USE_EVERY = timedelta(seconds=60)  # last_used_at is written at most this often


@dataclass(frozen=True)
class Principal:
    token_id: int
    name: str
    role: str

    def can(self, role: str) -> bool:
        return _RANK[self.role] >= _RANK[role]

    @property
    def actor(self) -> str:
        return f"token:{self.name}"


@dataclass(frozen=True)
class TokenInfo:
    name: str
    role: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role,
            "created_at": self.created_at.isoformat(),
            "last_used_at": self.last_used_at.isoformat() if self.last_used_at else None,
            "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
        }


@dataclass(frozen=True)
class Session:
    principal: Principal
    csrf: str

    def csrf_ok(self, sent: str | None) -> bool:
        return bool(sent) and hmac.compare_digest(self.csrf, sent or "")


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class Access:
    def __init__(self, database: Database) -> None:
        self.database = database

    # --- tokens --------------------------------------------------------------------------

    def create_token(self, name: str, role: str) -> tuple[TokenInfo, str]:
        """A new token; the secret is returned once and never stored."""
        if not _NAME.match(name):
            raise BadInput(
                f"{name!r} must be 1-64 characters of A-Z a-z 0-9 . _ @ -, starting with a "
                "letter or digit",
                field="name",
            )
        if role not in _RANK:
            raise BadInput(f"must be one of {', '.join(ROLES)}, got {role!r}", field="--role")
        secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
        now = utcnow()
        try:
            with self.database.transaction() as conn:
                conn.execute(
                    insert(api_tokens).values(
                        name=name, role=role, token_sha256=digest(secret), created_at=now
                    )
                )
        except IntegrityError:
            raise BadInput(
                f"a token named {name!r} exists; revoke it or choose another name", field="name"
            ) from None
        return TokenInfo(name, role, now, None, None), secret

    def list_tokens(self) -> list[TokenInfo]:
        with self.database.transaction() as conn:
            rows = conn.execute(select(api_tokens).order_by(api_tokens.c.name)).all()
        return [_info(row) for row in rows]

    def revoke(self, name: str) -> TokenInfo:
        with self.database.transaction() as conn:
            row = conn.execute(select(api_tokens).where(api_tokens.c.name == name)).first()
            if row is None:
                raise BadInput(f"no token named {name!r}", field="name")
            if row.revoked_at is None:
                conn.execute(
                    update(api_tokens).where(api_tokens.c.id == row.id).values(revoked_at=utcnow())
                )
            conn.execute(delete(console_sessions).where(console_sessions.c.token_id == row.id))
            row = conn.execute(select(api_tokens).where(api_tokens.c.id == row.id)).one()
        return _info(row)

    def verify(self, secret: str | None) -> Principal | None:
        """The token's holder, or None for an unknown, malformed or revoked token."""
        if not secret or not secret.startswith(TOKEN_PREFIX) or len(secret) > 200:
            return None
        with self.database.transaction() as conn:
            row = conn.execute(
                select(api_tokens).where(
                    api_tokens.c.token_sha256 == digest(secret), api_tokens.c.revoked_at.is_(None)
                )
            ).first()
            if row is None:
                return None
            now = utcnow()
            if row.last_used_at is None or now - row.last_used_at > LAST_USE_EVERY:
                conn.execute(
                    update(api_tokens).where(api_tokens.c.id == row.id).values(last_used_at=now)
                )
        return Principal(row.id, row.name, row.role)

    # --- console sessions ------------------------------------------------------------------

    def open_session(self, principal: Principal, hours: float) -> tuple[str, Session]:
        """A sign-in: the cookie's secret (returned once) and the session with its CSRF
        secret. Expired sessions are removed here."""
        secret = secrets.token_urlsafe(32)
        csrf = secrets.token_urlsafe(24)
        now = utcnow()
        with self.database.transaction() as conn:
            conn.execute(delete(console_sessions).where(console_sessions.c.expires_at < now))
            conn.execute(
                insert(console_sessions).values(
                    session_sha256=digest(secret),
                    token_id=principal.token_id,
                    csrf=csrf,
                    created_at=now,
                    expires_at=now + timedelta(hours=hours),
                )
            )
        return secret, Session(principal, csrf)

    def session(self, secret: str | None) -> Session | None:
        if not secret or len(secret) > 200:
            return None
        query = (
            select(console_sessions.c.csrf, api_tokens.c.id, api_tokens.c.name, api_tokens.c.role)
            .join(api_tokens, api_tokens.c.id == console_sessions.c.token_id)
            .where(
                console_sessions.c.session_sha256 == digest(secret),
                console_sessions.c.expires_at > utcnow(),
                api_tokens.c.revoked_at.is_(None),
            )
        )
        with self.database.transaction() as conn:
            row = conn.execute(query).first()
        if row is None:
            return None
        return Session(Principal(row.id, row.name, row.role), row.csrf)

    def close_session(self, secret: str | None) -> None:
        if secret:
            with self.database.transaction() as conn:
                conn.execute(
                    delete(console_sessions).where(
                        console_sessions.c.session_sha256 == digest(secret)
                    )
                )


def _info(row: Any) -> TokenInfo:
    return TokenInfo(row.name, row.role, row.created_at, row.last_used_at, row.revoked_at)
