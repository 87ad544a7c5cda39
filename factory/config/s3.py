"""How to reach the S3 store: endpoint, TLS material, transfer and retry settings.

Read from FACTORY_S3_* (`parse`); holds paths to key material, never its content.
Access keys come from boto3's own chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile,
an instance role) and are never copied into the factory's settings.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from factory.config.values import choice, existing_file, positive_float, positive_int
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


def parse(env: Mapping[str, str], home: Path) -> S3Settings:
    endpoint = env.get("FACTORY_S3_ENDPOINT_URL") or None
    if endpoint and not endpoint.startswith(("https://", "http://")):
        raise ConfigError(
            f"must be an https:// URL, got {endpoint!r}", field="FACTORY_S3_ENDPOINT_URL"
        )
    cert = existing_file(env, "FACTORY_S3_CLIENT_CERT")
    key = existing_file(env, "FACTORY_S3_CLIENT_KEY")
    if (cert is None) != (key is None):
        missing = "FACTORY_S3_CLIENT_KEY" if key is None else "FACTORY_S3_CLIENT_CERT"
        raise ConfigError("is needed too: a client certificate goes with its key", field=missing)
    if cert is not None and endpoint and endpoint.startswith("http://"):
        raise ConfigError(
            "is http:// but a client certificate is set: mutual TLS needs https://",
            field="FACTORY_S3_ENDPOINT_URL",
        )
    part_bytes = positive_int(env, "FACTORY_S3_PART_BYTES", 8 * MIB, unit="bytes")
    if part_bytes < 5 * MIB:
        raise ConfigError(f"must be at least 5 MiB (S3's smallest part), got {part_bytes}",
                          field="FACTORY_S3_PART_BYTES")  # fmt: skip
    region = env.get("FACTORY_S3_REGION") or "us-east-1"
    if not re.fullmatch(r"[a-z0-9-]{1,40}", region):
        raise ConfigError(f"{region!r} is not a region name", field="FACTORY_S3_REGION")
    return S3Settings(
        endpoint_url=endpoint,
        region=region,
        addressing=choice(env, "FACTORY_S3_ADDRESSING", ("path", "virtual", "auto")),
        ca_bundle=existing_file(env, "FACTORY_S3_CA"),
        client_cert=cert,
        client_key=key,
        checksums=choice(env, "FACTORY_S3_CHECKSUMS", ("when_supported", "when_required")),
        multipart_bytes=positive_int(env, "FACTORY_S3_MULTIPART_BYTES", 8 * MIB, unit="bytes"),
        part_bytes=part_bytes,
        part_workers=positive_int(env, "FACTORY_S3_PART_WORKERS", 4, unit="threads"),
        verify=choice(env, "FACTORY_S3_VERIFY", ("etag", "download")),
        attempts=positive_int(env, "FACTORY_S3_ATTEMPTS", 5, unit="attempts"),
        backoff=positive_float(env, "FACTORY_S3_BACKOFF", 1.0),
        scratch=home / "tmp",
    )
