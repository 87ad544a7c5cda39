"""`factory`: the admin CLI (factory.cli.main wires the commands of the modules beside it)."""

from factory.cli.main import app, main

__all__ = ["app", "main"]
