"""Object storage: keys, the `file://` store (embedded), the `s3://` store (boto3, mutual TLS)
and the local asset cache."""

from __future__ import annotations

from typing import TYPE_CHECKING

from factory.errors import ConfigError
from factory.store.base import ObjectInfo, Store
from factory.store.file import FileStore

if TYPE_CHECKING:
    from factory.config.s3 import S3Settings

__all__ = ["FileStore", "ObjectInfo", "Store", "open_store"]


def open_store(url: str, s3: S3Settings | None = None, *, durable: bool = True) -> Store:
    """The store at URL: `file:///path` or `s3://bucket/prefix` (reached with `s3`).
    ``durable``: a file store syncs every write to disk before it returns."""
    if url.startswith("file://"):
        return FileStore.from_url(url, durable=durable)
    if url.startswith("s3://"):
        from factory.config.s3 import S3Settings
        from factory.store.s3 import S3Store  # boto3 is imported only where S3 is used

        return S3Store(url, s3 or S3Settings())
    scheme = url.split("://", 1)[0]
    raise ConfigError(
        f"the {scheme}:// store is not supported; use file:///path or s3://bucket/prefix",
        field="FACTORY_STORE_URL",
    )
