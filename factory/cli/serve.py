"""`factory serve` (the operations console and HTTP API) and `factory token` (who may use
them); docs/console.md."""

from __future__ import annotations

import json
import sys

import typer
from rich.table import Table

from factory.access import Access
from factory.cli import common
from factory.cli.common import err, out
from factory.db.models import ROLES

token_app = typer.Typer(
    help="Tokens for the HTTP API and the console (roles: viewer, operator, admin).",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
    app.add_typer(token_app, name="token")


def serve(
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to listen on (put it behind the TLS gateway)."
    ),
    port: int = typer.Option(8080, "--port", min=0, max=65535, help="Port to listen on."),
) -> None:
    """The operations console (/) and the HTTP API (/api/v1, schema at /api/v1/openapi.json).
    Everything but /healthz needs a token (`factory token create NAME --role ROLE`)."""
    import uvicorn

    from factory.web.server import create_app

    settings = common.settings()
    application = create_app(settings)
    err.print(f"console and API on http://{host}:{port}/ (database {settings.database_url})")
    uvicorn.run(
        application,
        host=host,
        port=port,
        log_level="warning",
        proxy_headers=False,  # the app believes forwarded headers from the listed proxies only
        server_header=False,
    )


def _access() -> Access:
    return Access(common.open_factory().database)


@token_app.command("create")
def token_create(
    name: str = typer.Argument(..., help="Who or what holds it, e.g. alice or ci-submitter."),
    role: str = typer.Option(..., "--role", help=f"One of {', '.join(ROLES)}."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Create a token and print it once (only its SHA-256 is kept)."""
    info, secret = _access().create_token(name, role)
    if as_json:
        sys.stdout.write(json.dumps({**info.to_dict(), "token": secret}) + "\n")
        return
    out.print(secret)
    err.print(f"token {info.name} ({info.role}) created; it is shown only now")


@token_app.command("list")
def token_list(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Every token with its role, last use and whether it is revoked."""
    found = _access().list_tokens()
    if as_json:
        sys.stdout.write(json.dumps([t.to_dict() for t in found], indent=2) + "\n")
        return
    table = Table("NAME", "ROLE", "CREATED", "LAST USED", "REVOKED")
    for t in found:
        table.add_row(
            t.name,
            t.role,
            t.created_at.strftime("%Y-%m-%d %H:%M"),
            t.last_used_at.strftime("%Y-%m-%d %H:%M") if t.last_used_at else "never",
            t.revoked_at.strftime("%Y-%m-%d %H:%M") if t.revoked_at else "",
        )
    out.print(table)


@token_app.command("revoke")
def token_revoke(name: str = typer.Argument(...)) -> None:
    """Refuse the token from now on and end its console sessions."""
    info = _access().revoke(name)
    out.print(f"token {info.name} revoked")
