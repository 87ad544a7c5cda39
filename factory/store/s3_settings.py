"""How to reach the S3 store: endpoint, TLS material, transfer and retry settings.

Built from FACTORY_S3_* by `factory.config`; holds paths to key material, never its content.
Access keys come from boto3's own chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile,
an instance role) and are never copied into the factory's settings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from factory.errors import BadInput, ConfigError
from factory.store.base import check_key

MIB = 1 << 20
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class S3Settings:
    endpoint_url: str | None = None  # None: AWS itself
    region: str = "us-east-1"
    addressing: str = "path"  # path | virtual | auto (MinIO and most gateways want path)
    ca_bundle: Path | None = None  # None: the system's CAs
    client_cert: Path | None = None  # PEM; with an intermediate CA, the chain follows the leaf
    client_key: Path | None = None
    checksums: str = "when_supported"  # or when_required, for stores that reject CRC trailers
    multipart_bytes: int = 8 * MIB  # files from this size up go in parts
    part_bytes: int = 8 * MIB
    part_workers: int = 4
    verify: str = "etag"  # etag: the server's MD5 of what it stored; download: read it back
    attempts: int = 5  # per request, for connection errors and 5xx
    backoff: float = 1.0  # seconds before the second attempt; doubles, capped at 30 s
    scratch: Path | None = None  # where downloads land (None: the system's temp dir)

    def describe(self) -> str:
        """What to check, for error messages: paths and the endpoint, no secret."""
        parts = [f"endpoint {self.endpoint_url or 'AWS'}"]
        parts.append(f"CA {self.ca_bundle or 'system'}")
        if self.client_cert:
            parts.append(f"client certificate {self.client_cert}")
        return ", ".join(parts)


def split_url(url: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix` -> ("bucket", "some/prefix")."""
    parsed = urlparse(url)
    bucket, prefix = parsed.netloc, parsed.path.strip("/")
    if parsed.scheme != "s3" or not _BUCKET.match(bucket):
        raise ConfigError(
            f"{url!r} is not s3://BUCKET[/PREFIX] with a valid bucket name",
            field="FACTORY_STORE_URL",
        )
    if prefix:
        try:
            check_key(prefix)
        except BadInput:
            raise ConfigError(
                f"prefix {prefix!r} must be parts of A-Z a-z 0-9 . _ - (no '..')",
                field="FACTORY_STORE_URL",
            ) from None
    return bucket, prefix
