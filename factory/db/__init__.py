"""Persistence: the tables, the engine, migrations, and the job state machine."""
