"""The `s3://bucket/prefix` store: boto3 to MinIO or any S3 store, usually through a gateway
that requires a client certificate (docker/nginx-mtls.conf).

- Every object carries the sha256 of its content as metadata (`x-amz-meta-sha256`); a put
  whose sha256 is already there is skipped, so re-delivery is a no-op.
- Nothing partial is ever visible under a final key: a single PUT appears whole or not at
  all, and a multipart upload appears only when completed, after every part's ETag (the
  server's MD5 of what it received) matched ours. After the upload the object's ETag, size
  and sha256 are checked again (or, with `verify=download`, the object is read back).
- Connection errors and 5xx are retried here with backoff, then surface as RetryableError
  (the job waits in its stage and resumes); certificate and TLS failures, refused credentials
  and missing buckets are PermanentError with a message that says what to check.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import random
import re
import tempfile
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from factory.config.s3 import S3Settings, split_url
from factory.errors import BadInput, PermanentError, RetryableError
from factory.store.base import ObjectInfo, check_key
from factory.store.s3_errors import Corrupt, classify, error_code, http_status
from factory.store.tls_session import load_tls_once

log = logging.getLogger("factory.store.s3")
T = TypeVar("T")

_READ_CHUNK = 1 << 20
DELETE_BATCH = 1000  # the most keys one DeleteObjects request takes
_ETAG = re.compile(r'^"?([0-9a-f]{32})(-\d+)?"?$')


class NotFound(Exception):
    pass


def make_client(settings: S3Settings) -> Any:
    client_cert = (
        (str(settings.client_cert), str(settings.client_key)) if settings.client_cert else None
    )
    config = Config(
        signature_version="s3v4",
        region_name=settings.region,
        s3={"addressing_style": settings.addressing},
        client_cert=client_cert,
        retries={"total_max_attempts": 1, "mode": "standard"},  # retried here, by kind
        connect_timeout=5,
        read_timeout=120,
        max_pool_connections=max(10, settings.part_workers * 2),
        request_checksum_calculation=settings.checksums,
        response_checksum_validation=settings.checksums,
    )
    verify: str | bool = str(settings.ca_bundle) if settings.ca_bundle else True
    client = boto3.session.Session().client(
        "s3", endpoint_url=settings.endpoint_url, verify=verify, config=config
    )
    return load_tls_once(client, client_cert)


class S3Store:
    def __init__(self, url: str, settings: S3Settings, client: Any | None = None) -> None:
        self.bucket, self.prefix = split_url(url)
        self.url = f"s3://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        self.settings = settings
        self.client = client if client is not None else make_client(settings)
        self._pool: ThreadPoolExecutor | None = None  # part uploads; threads live with the store
        _LIVE.add(self)

    def close(self) -> None:
        """Close the connections now rather than whenever the garbage collector gets to them."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self.client.close()

    # --- the Store interface -------------------------------------------------------------

    def put_file(self, key: str, source: Path, *, move: bool = False) -> None:
        name = self._name(key)
        size = source.stat().st_size
        sha256 = _file_sha256(source)
        if self._has(name, sha256, size):
            log.info("store.put.skipped", extra={"key": name, "reason": "same sha256 there"})
        elif size >= self.settings.multipart_bytes:
            self._put_multipart(name, source, size, sha256)
        else:
            self._put_single(name, source.read_bytes(), sha256)
        if move:
            source.unlink(missing_ok=True)

    def put_bytes(self, key: str, data: bytes) -> None:
        name = self._name(key)
        sha256 = hashlib.sha256(data).hexdigest()
        if not self._has(name, sha256, len(data)):
            self._put_single(name, data, sha256)

    def exists(self, key: str) -> bool:
        try:
            self._head(self._name(key))
        except NotFound:
            return False
        return True

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            head = self._head(self._name(key))
        except NotFound:
            return None
        return _info(head)

    @contextmanager
    def local_path(self, key: str) -> Iterator[Path]:
        """A downloaded copy, checked against the sha256 recorded at upload; removed after."""
        scratch = self.settings.scratch or Path(tempfile.gettempdir())
        scratch.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=scratch, prefix=".s3-", suffix=Path(key).suffix)
        os.close(fd)
        path = Path(name)
        try:
            self.download(key, path)
            yield path
        finally:
            path.unlink(missing_ok=True)

    def read_range(self, key: str, start: int, end: int) -> Iterator[bytes]:
        name = self._name(key)

        def fetch() -> Any:
            try:
                return self.client.get_object(
                    Bucket=self.bucket, Key=name, Range=f"bytes={start}-{end}"
                )["Body"]
            except ClientError as exc:
                if http_status(exc) == 404:
                    raise FileNotFoundError(name) from None
                raise

        body = self._call(f"get s3://{self.bucket}/{name} bytes {start}-{end}", fetch)
        try:
            yield from body.iter_chunks(1 << 20)
        finally:
            body.close()

    def download(self, key: str, target: Path) -> ObjectInfo:
        name = self._name(key)

        def fetch() -> ObjectInfo:
            try:
                response = self.client.get_object(Bucket=self.bucket, Key=name)
            except ClientError as exc:
                if http_status(exc) == 404:
                    raise FileNotFoundError(f"{self.url_for(key)} does not exist") from None
                raise
            digest = hashlib.sha256()
            with open(target, "wb") as out:
                for chunk in response["Body"].iter_chunks(_READ_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
            info = _info(response)
            if info.sha256 and digest.hexdigest() != info.sha256:
                raise Corrupt(f"{self.url_for(key)}: downloaded bytes do not match its sha256")
            return ObjectInfo(info.size, digest.hexdigest(), info.etag)

        return self._call(f"get {self.url_for(key)}", fetch)

    def delete(self, key: str) -> None:
        name = self._name(key)
        self._call(
            f"delete {self.url_for(key)}",
            lambda: self.client.delete_object(Bucket=self.bucket, Key=name),
        )

    def url_for(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._name(key)}"

    def list(self, prefix: str) -> Iterator[str]:
        for key, _size in self.list_sizes(prefix):
            yield key

    def list_sizes(self, prefix: str) -> Iterator[tuple[str, int]]:
        base = self._name(prefix.strip("/")) + "/" if prefix.strip("/") else self._root()
        token: str | None = None
        while True:
            args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": base}
            if token:
                args["ContinuationToken"] = token
            page = self._call(
                f"list {self.url}/{prefix}", lambda a=args: self.client.list_objects_v2(**a)
            )
            for item in page.get("Contents", []):
                yield item["Key"][len(self._root()) :], int(item.get("Size", 0))
            if not page.get("IsTruncated"):
                return
            token = page["NextContinuationToken"]

    def delete_many(self, keys: Sequence[str]) -> dict[str, str]:
        """DeleteObjects, up to 1000 keys a request (quiet: only failures come back). A key
        the store could not remove is returned with its code and message; a request that
        fails as a whole is retried like any other, then raises."""
        failed: dict[str, str] = {}
        names = {self._name(key): key for key in keys}
        listed = list(names)
        for start in range(0, len(listed), DELETE_BATCH):
            batch = listed[start : start + DELETE_BATCH]
            request = {"Objects": [{"Key": name} for name in batch], "Quiet": True}
            answer = self._call(
                f"delete {len(batch)} objects from s3://{self.bucket}",
                lambda r=request: self.client.delete_objects(Bucket=self.bucket, Delete=r),
            )
            for error in answer.get("Errors", []):
                key = names.get(error.get("Key", ""), error.get("Key", "?"))
                failed[key] = f"{error.get('Code', '?')}: {error.get('Message', '')}".strip()
        return failed

    # --- uploads -------------------------------------------------------------------------

    def _put_single(self, name: str, data: bytes, sha256: str) -> None:
        md5 = hashlib.md5(data, usedforsecurity=False).digest()
        writer = _writer_token()

        def put() -> None:
            self.client.put_object(
                Bucket=self.bucket,
                Key=name,
                Body=data,
                ContentMD5=base64.b64encode(md5).decode(),
                Metadata={"sha256": sha256, "writer": writer},
            )

        self._call(f"put s3://{self.bucket}/{name}", put)
        self._verify(name, len(data), sha256, md5.hex(), writer)

    def _put_multipart(self, name: str, source: Path, size: int, sha256: str) -> None:
        part_bytes = self.settings.part_bytes
        offsets = list(range(0, size, part_bytes))
        where = f"s3://{self.bucket}/{name}"
        writer = _writer_token()
        upload_id = self._call(
            f"start upload {where}",
            lambda: self.client.create_multipart_upload(
                Bucket=self.bucket, Key=name, Metadata={"sha256": sha256, "writer": writer}
            )["UploadId"],
        )

        def send(number: int) -> tuple[str, bytes]:
            with open(source, "rb") as fh:
                fh.seek(offsets[number - 1])
                data = fh.read(part_bytes)
            md5 = hashlib.md5(data, usedforsecurity=False).digest()

            def upload() -> str:
                etag = self.client.upload_part(
                    Bucket=self.bucket, Key=name, UploadId=upload_id, PartNumber=number,
                    Body=data, ContentMD5=base64.b64encode(md5).decode(),
                )["ETag"]  # fmt: skip
                if _etag_md5(etag) not in (None, md5.hex()):
                    raise Corrupt(f"{where} part {number}: the server's MD5 differs from ours")
                return etag

            return self._call(f"upload {where} part {number}", upload), md5

        try:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.settings.part_workers, "s3-part")
            sent = list(self._pool.map(send, range(1, len(offsets) + 1)))
            parts = [{"PartNumber": n, "ETag": etag} for n, (etag, _) in enumerate(sent, 1)]
            self._call(
                f"complete upload {where}",
                lambda: self.client.complete_multipart_upload(
                    Bucket=self.bucket, Key=name, UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                ),
            )  # fmt: skip
        except BaseException:
            # Best effort: an upload left open (the gateway is down) is invisible and is
            # cleared by the bucket's AbortIncompleteMultipartUpload rule (docs/storage.md).
            with suppress(Exception):
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=name, UploadId=upload_id)
            raise
        combined = hashlib.md5(b"".join(md5 for _, md5 in sent), usedforsecurity=False)
        self._verify(name, size, sha256, f"{combined.hexdigest()}-{len(sent)}", writer)

    def _verify(self, name: str, size: int, sha256: str, etag: str, writer: str) -> None:
        """The object under its final key is the one we sent: by ETag and size, or by reading
        it back (verify=download). What another writer put there since (its `writer` token
        differs) is never removed: with the same content our put is done, with other content
        it is that writer's, and this put failed. Only a bad copy of our own is removed (and
        retried by the caller's stage)."""
        head = self._head(name)
        info = _info(head)
        theirs = _metadata(head).get("writer") != writer
        if theirs:
            if info.sha256 == sha256 and info.size == size:
                return  # the same bytes, put by someone else meanwhile: nothing to do
            raise RetryableError(
                f"s3://{self.bucket}/{name} was written by another writer while this put ran "
                "(left as it is; a superseded worker stops at its next check)"
            )
        problem = advice = None
        if info.size != size or info.sha256 != sha256:
            problem = f"size {info.size} / sha256 {info.sha256} where {size} / {sha256} was sent"
        elif self.settings.verify == "download":
            digest = self._call(f"read back s3://{self.bucket}/{name}", lambda: _remote_sha(
                self.client, self.bucket, name))  # fmt: skip
            if digest != sha256:
                problem = f"read back sha256 {digest}, sent {sha256}"
        elif _ETAG.match(info.etag.strip()) and info.etag.strip('"') != etag:
            problem = f"ETag {info.etag} where {etag} was expected"
            advice = (
                "if the bucket encrypts with SSE-KMS or SSE-C its ETags are not MD5s: set "
                "FACTORY_S3_VERIFY=download"
            )
        if problem:
            with suppress(Exception):
                if _metadata(self._head(name)).get("writer") == writer:  # still ours
                    self.client.delete_object(Bucket=self.bucket, Key=name)
            raise RetryableError(
                f"s3://{self.bucket}/{name} failed verification: {problem}"
                + (f" ({advice})" if advice else "")
            )

    # --- requests, by kind of failure ----------------------------------------------------

    def _has(self, name: str, sha256: str, size: int) -> bool:
        try:
            info = _info(self._head(name))
        except NotFound:
            return False
        return info.sha256 == sha256 and info.size == size

    def _head(self, name: str) -> dict[str, Any]:
        def head() -> dict[str, Any]:
            try:
                return self.client.head_object(Bucket=self.bucket, Key=name)
            except ClientError as exc:
                if http_status(exc) == 404 and error_code(exc) in ("404", "NoSuchKey", "NotFound"):
                    raise NotFound(name) from None
                raise

        return self._call(f"head s3://{self.bucket}/{name}", head)

    def _call(self, what: str, request: Callable[[], T]) -> T:
        attempts = self.settings.attempts
        for attempt in range(1, attempts + 1):
            try:
                return request()
            except (NotFound, FileNotFoundError, PermanentError, BadInput):
                raise
            except Exception as exc:
                reason = self._classify(exc)  # raises PermanentError for what retries can't fix
                if attempt == attempts:
                    raise RetryableError(
                        f"{what}: {reason} (gave up after {attempts} attempts; the job waits "
                        "in its stage and resumes)",
                        reason=f"{what}: {reason} (gave up after {attempts} attempts)",
                    ) from None
                pause = min(30.0, self.settings.backoff * 2 ** (attempt - 1))
                pause *= random.uniform(0.8, 1.2)
                log.warning(
                    "store.retry",
                    extra={"request": what, "attempt": attempt, "error": reason,
                           "pause_s": round(pause, 2)},
                )  # fmt: skip
                time.sleep(pause)
        raise AssertionError("unreachable")

    def _classify(self, exc: Exception) -> str:
        """A short reason for a retryable failure; raises PermanentError for the rest."""
        return classify(exc, self.settings, self.url, self.bucket)

    def _name(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _root(self) -> str:
        return f"{self.prefix}/" if self.prefix else ""


_LIVE: weakref.WeakSet[S3Store] = weakref.WeakSet()


def close_all() -> None:
    """Close every store of this process (tests, between cases): connections are then not
    left for the garbage collector to close at an arbitrary point later."""
    for store in list(_LIVE):
        store.close()


def _metadata(response: dict[str, Any]) -> dict[str, str]:
    return {k.lower(): v for k, v in (response.get("Metadata") or {}).items()}


def _writer_token() -> str:
    """Who wrote an object (x-amz-meta-writer): one token per put."""
    return uuid.uuid4().hex


def _info(response: dict[str, Any]) -> ObjectInfo:
    metadata = _metadata(response)
    return ObjectInfo(
        size=int(response.get("ContentLength", 0)),
        sha256=metadata.get("sha256"),
        etag=str(response.get("ETag", "")),
    )


def _remote_sha(client: Any, bucket: str, name: str) -> str:
    digest = hashlib.sha256()
    body = client.get_object(Bucket=bucket, Key=name)["Body"]
    for chunk in body.iter_chunks(_READ_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _etag_md5(etag: str) -> str | None:
    match = _ETAG.match(etag.strip())
    return match.group(1) if match and not match.group(2) else None
