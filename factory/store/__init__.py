"""Object storage: keys, the `file://` store (embedded) and, later, `s3://` over mutual TLS."""

from __future__ import annotations

from factory.errors import ConfigError
from factory.store.base import Store
from factory.store.file import FileStore


def open_store(url: str) -> Store:
    if url.startswith("file://"):
        return FileStore.from_url(url)
    scheme = url.split("://", 1)[0]
    raise ConfigError(
        f"the {scheme}:// store is not available in this build", field="FACTORY_STORE_URL"
    )
