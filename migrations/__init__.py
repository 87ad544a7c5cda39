"""Alembic migration history (installed with the package so `factory db upgrade` finds it)."""
