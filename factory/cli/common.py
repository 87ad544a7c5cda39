"""What every `factory` command shares: the consoles, the settings, and the operations layer
wired for a shell (the CLI is a composition root: it injects where accepted work goes)."""

from __future__ import annotations

import socket
import sys
from typing import TYPE_CHECKING

from rich.console import Console

from factory.config import Settings
from factory.errors import BadInput

if TYPE_CHECKING:
    from factory.job import Job
    from factory.ops import Dispatcher, Operations
    from factory.wiring import Factory

# Piped output (cron logs, scripts) gets wide tables instead of rich's 80-column default.
out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def settings() -> Settings:
    return Settings.from_env()


def open_factory() -> Factory:
    from factory.wiring import Factory

    return Factory.open(settings())


def operations(*, send: bool = True) -> Operations:
    """The operations layer as a shell uses it: with a broker, accepted work goes to the
    workers (a broker that is away is a warning: the sweeper sends the jobs later); without
    one, or with `send=False`, it is only recorded and the command runs it here."""
    from factory.ops import Operations

    factory = open_factory()
    return Operations(factory, dispatcher=dispatcher(factory.settings) if send else None)


def dispatcher(current: Settings) -> Dispatcher | None:
    if not current.broker_url:
        return None
    from tasks.dispatch import BrokerDispatcher  # the CLI is where factory/ meets tasks/

    return BrokerDispatcher(current, on_outage=_warn_not_sent)


def _warn_not_sent(found: list[Job], exc: Exception) -> None:
    err.print(
        f"warning: recorded but not dispatched ({type(exc).__name__}: {exc}); "
        "the sweeper sends them once the broker is back",
        markup=False,
    )


def check_health_port(host: str, port: int) -> None:
    """Refuse a --health-port another process holds, before the worker starts: a worker
    whose endpoint cannot bind would run unprobed (its probe would restart it in a loop)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the endpoint binds
        try:
            sock.bind((host, port))
        except OSError as error:
            raise BadInput(f"{host}:{port} cannot be bound ({error.strerror})",
                           field="--health-port") from None  # fmt: skip
