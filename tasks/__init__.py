"""Celery side of the factory: the app, queues, routing and thin tasks that call `factory/`.

Nothing in `factory/` imports this package, so the pipeline also runs in-process.
"""
