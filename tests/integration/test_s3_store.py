"""The s3 store through a real gateway: Debian nginx verifying client certificates in front
of moto's S3 server (tests/s3stand.py), over the wire format boto3 uses in production."""

from __future__ import annotations

import hashlib
import logging
import os
import ssl
import threading
import time
from pathlib import Path

import pytest

from factory.errors import PermanentError, RetryableError
from factory.store.s3 import S3Store


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def store(s3_stand, bucket) -> S3Store:
    return S3Store(f"s3://{bucket}/nightly", s3_stand.settings())


def stored_bytes(s3_stand, bucket: str, name: str) -> bytes:
    return s3_stand.direct_client().get_object(Bucket=bucket, Key=name)["Body"].read()


def puts_logged(s3_stand, uri: str) -> int:
    log = (s3_stand.root / "gateway-access.log").read_text()
    return sum(1 for line in log.splitlines() if f'"PUT {uri}"' in line)


def test_put_get_and_list_through_the_gateway(s3_stand, bucket, store, tmp_path: Path) -> None:
    data = os.urandom(300_000)
    source = tmp_path / "out.mp4"
    source.write_bytes(data)
    store.put_file("batch/v1/out/mobile.mp4", source)
    store.put_bytes("batch/v1/qc.json", b'{"passed": true}')

    assert stored_bytes(s3_stand, bucket, "nightly/batch/v1/out/mobile.mp4") == data
    head = s3_stand.direct_client().head_object(Bucket=bucket, Key="nightly/batch/v1/qc.json")
    assert head["Metadata"]["sha256"] == sha256(b'{"passed": true}')
    with store.local_path("batch/v1/out/mobile.mp4") as path:
        assert path.read_bytes() == data
    assert not path.exists()  # the downloaded copy is removed after use
    assert sorted(store.list("batch/v1")) == ["batch/v1/out/mobile.mp4", "batch/v1/qc.json"]
    assert store.exists("batch/v1/qc.json") and not store.exists("batch/v1/nothing")
    assert store.url_for("batch/v1/qc.json") == f"s3://{bucket}/nightly/batch/v1/qc.json"
    store.delete("batch/v1/qc.json")
    assert not store.exists("batch/v1/qc.json")
    with pytest.raises(FileNotFoundError), store.local_path("batch/v1/qc.json"):
        pass


def test_multipart_above_the_threshold_is_whole_and_verified(s3_stand, bucket, store, tmp_path):
    data = os.urandom(13 << 20)  # three parts of 5 MiB at most
    source = tmp_path / "big.mp4"
    source.write_bytes(data)
    store.put_file("big.mp4", source)

    info = store.stat("big.mp4")
    assert info is not None and info.size == len(data) and info.sha256 == sha256(data)
    assert info.etag.strip('"').endswith("-3")  # really went in three parts
    assert sha256(stored_bytes(s3_stand, bucket, "nightly/big.mp4")) == sha256(data)
    uploads = s3_stand.direct_client().list_multipart_uploads(Bucket=bucket)
    assert not uploads.get("Uploads")  # none left open


def test_parallel_connections_leave_the_shared_tls_context_alone(
    s3_stand, bucket, monkeypatch
) -> None:
    """botocore hands urllib3 the client certificate and CA bundle as files, and urllib3
    loaded them into the client's one SSLContext at every new connection: parallel uploads
    changed a context other threads were making connections from (OpenSSL forbids it; seen
    as handshakes failing with "unknown key type" and a test process stuck in SSL_free).
    The store's client loads them once per context; many connections load nothing."""
    loads: list[str] = []
    wraps: list[int] = []
    for name in ("load_cert_chain", "load_verify_locations", "wrap_socket"):
        real = getattr(ssl.SSLContext, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):  # type: ignore[no-untyped-def]
            (wraps if _name == "wrap_socket" else loads).append(_name)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(ssl.SSLContext, name, counted)
    store = S3Store(f"s3://{bucket}/parallel", s3_stand.settings())
    loads.clear()  # what making the client loaded

    def put_some(worker: int) -> None:
        for n in range(3):
            store.put_bytes(f"w{worker}/{n}.json", os.urandom(64))

    threads = [threading.Thread(target=put_some, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(wraps) >= 2  # new connections were made in parallel ...
    assert loads == []  # ... and none of them changed the context
    assert len([*store.list("")]) == 24
    store.close()


def test_redelivering_the_same_content_is_a_no_op(s3_stand, bucket, store, tmp_path) -> None:
    source = tmp_path / "a.mp4"
    source.write_bytes(os.urandom(100_000))
    store.put_file("again/a.mp4", source)
    store.put_file("again/a.mp4", source)
    store.put_file("again/a.mp4", source)
    assert puts_logged(s3_stand, f"/{bucket}/nightly/again/a.mp4") == 1
    source.write_bytes(os.urandom(100_000))  # new content under the same key is uploaded
    store.put_file("again/a.mp4", source)
    assert puts_logged(s3_stand, f"/{bucket}/nightly/again/a.mp4") == 2
    assert stored_bytes(s3_stand, bucket, "nightly/again/a.mp4") == source.read_bytes()


@pytest.mark.parametrize(
    ("client", "verdict", "advice"),
    [
        (None, "NONE", "no client certificate was sent"),
        ("stranger", "FAILED:", "not issued by a CA the gateway trusts"),
        ("expired", "certificate has expired", "has expired"),
        ("not-yet-valid", "certificate is not yet valid", "not valid yet"),
        ("no-chain", "FAILED:", "without its intermediate CA"),
    ],
)
def test_rejected_client_certificates_are_clear_permanent_errors(
    s3_stand, bucket, client, verdict, advice, caplog
) -> None:
    store = S3Store(f"s3://{bucket}", s3_stand.settings(client, attempts=5, backoff=5.0))
    for attempt in (
        lambda: store.put_bytes("k", b"data"),
        lambda: store.exists("k"),
        lambda: list(store.list("")),
    ):
        started = time.monotonic()
        with pytest.raises(PermanentError) as raised, caplog.at_level(logging.WARNING):
            attempt()
        message = str(raised.value)
        assert "rejected the client certificate" in message
        assert verdict in message and advice in message
        assert time.monotonic() - started < 4  # not retried (a retry would wait 5 s)
    assert not [r for r in caplog.records if r.getMessage() == "store.retry"]
    assert not s3_stand.direct_client().list_objects_v2(Bucket=bucket).get("Contents")


def test_a_client_certificate_from_an_intermediate_with_its_chain_is_accepted(
    s3_stand, bucket
) -> None:
    store = S3Store(f"s3://{bucket}", s3_stand.settings("via-intermediate"))
    store.put_bytes("ok", b"chained")
    assert stored_bytes(s3_stand, bucket, "ok") == b"chained"


def test_tls_mistakes_on_our_side_are_permanent_and_say_what_to_check(s3_stand, bucket) -> None:
    untrusted = s3_stand.settings(ca_bundle=s3_stand.other_certs / "ca.pem")
    with pytest.raises(PermanentError, match="FACTORY_S3_CA"):
        S3Store(f"s3://{bucket}", untrusted).put_bytes("k", b"x")
    wrong_key = s3_stand.settings(client_key=s3_stand.certs / "expired.key")
    with pytest.raises(PermanentError, match="is not the key of FACTORY_S3_CLIENT_CERT"):
        S3Store(f"s3://{bucket}", wrong_key).put_bytes("k", b"x")


def test_a_missing_bucket_is_permanent(s3_stand) -> None:
    with pytest.raises(PermanentError, match="does not exist"):
        S3Store("s3://no-such-bucket-here", s3_stand.settings()).put_bytes("k", b"x")


def test_gateway_down_is_retried_then_retryable_and_nothing_partial_shows(
    s3_stand, bucket, store, tmp_path, caplog
) -> None:
    data = os.urandom(16 << 20)
    source = tmp_path / "render.mp4"
    source.write_bytes(data)
    stopped = threading.Event()

    def stop_after_first_part(**_: object) -> None:
        if not stopped.is_set():
            stopped.set()
            s3_stand.stop_gateway()

    store.client.meta.events.register("after-call.s3.UploadPart", stop_after_first_part)
    try:
        with (
            pytest.raises(RetryableError, match="cannot reach") as raised,
            caplog.at_level(logging.WARNING),
        ):
            store.put_file("out/render.mp4", source)
        assert "gave up after 3 attempts" in str(raised.value)
        assert [r for r in caplog.records if r.getMessage() == "store.retry"]
        direct = s3_stand.direct_client()
        assert not direct.list_objects_v2(Bucket=bucket).get("Contents")  # no partial object
    finally:
        store.client.meta.events.unregister("after-call.s3.UploadPart", stop_after_first_part)
        s3_stand.start_gateway()
    store.put_file("out/render.mp4", source)
    assert sha256(stored_bytes(s3_stand, bucket, "nightly/out/render.mp4")) == sha256(data)


def test_verify_by_download_reads_the_object_back(s3_stand, bucket, tmp_path) -> None:
    store = S3Store(f"s3://{bucket}", s3_stand.settings(verify="download"))
    source = tmp_path / "x.bin"
    source.write_bytes(os.urandom(7 << 20))
    store.put_file("x.bin", source)
    gets = [
        line
        for line in (s3_stand.root / "gateway-access.log").read_text().splitlines()
        if f'"GET /{bucket}/x.bin"' in line
    ]
    assert len(gets) == 1


def test_no_secret_reaches_logs_or_errors(s3_stand, bucket, store, tmp_path, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    messages: list[str] = []
    store.put_bytes("s/one", b"1")
    for client in (None, "expired"):
        try:
            S3Store(f"s3://{bucket}", s3_stand.settings(client)).put_bytes("s/two", b"2")
        except PermanentError as exc:
            messages.append(str(exc))
    s3_stand.stop_gateway()
    try:
        store.put_bytes("s/three", b"3")
    except RetryableError as exc:
        messages.append(str(exc))
    finally:
        s3_stand.start_gateway()
    from factory.infra.redact import RedactingFilter

    redacting = RedactingFilter()
    text = "\n".join(messages)
    for record in caplog.records:
        redacting.filter(record)
        text += "\n" + record.getMessage() + " " + str(vars(record))
    assert len(messages) == 3
    for secret in s3_stand.secrets():
        assert secret not in text


class _OvertakenWriter(S3Store):
    """A writer (a superseded worker) whose put is overtaken: another writer puts the same key
    after this put's bytes arrived and before this writer verifies them."""

    def __init__(self, url: str, settings, overtake) -> None:
        super().__init__(url, settings)
        self.overtake = overtake

    def _verify(self, *args, **kwargs) -> None:
        overtake, self.overtake = self.overtake, lambda: None
        overtake()
        super()._verify(*args, **kwargs)


def test_a_writer_never_deletes_what_another_writer_committed(s3_stand, bucket, store) -> None:
    key = "batch/v1/out/master.mp4"
    committed = os.urandom(200_000)
    stale = _OvertakenWriter(f"s3://{bucket}/nightly", s3_stand.settings(),
                             lambda: store.put_bytes(key, committed))  # fmt: skip
    with pytest.raises(RetryableError, match="another writer"):
        stale.put_bytes(key, os.urandom(200_000))
    assert stored_bytes(s3_stand, bucket, f"nightly/{key}") == committed
    # The same bytes put by someone else meanwhile: this put is simply done.
    same = _OvertakenWriter(f"s3://{bucket}/nightly", s3_stand.settings(),
                            lambda: store.put_bytes("batch/v1/qc.json", b"{}"))  # fmt: skip
    same.client.delete_object(Bucket=bucket, Key="nightly/batch/v1/qc.json")
    same.put_bytes("batch/v1/qc.json", b"{}")
    assert stored_bytes(s3_stand, bucket, "nightly/batch/v1/qc.json") == b"{}"


class _KmsEtags:
    """A client whose HEAD answers carry ETags that are not the MD5 of the bytes, as a bucket
    encrypting with SSE-KMS answers."""

    def __init__(self, client) -> None:
        self._client = client

    def head_object(self, **kwargs):
        head = self._client.head_object(**kwargs)
        return {**head, "ETag": '"0123456789abcdef0123456789abcdef"'}

    def __getattr__(self, name: str):
        return getattr(self._client, name)


def test_etags_that_are_not_md5s_fail_with_the_setting_to_change(s3_stand, bucket) -> None:
    from factory.store.s3 import make_client

    settings = s3_stand.settings()
    store = S3Store(f"s3://{bucket}/kms", settings, client=_KmsEtags(make_client(settings)))
    with pytest.raises(RetryableError) as caught:
        store.put_bytes("batch/v1/qc.json", b'{"passed": true}')
    assert "FACTORY_S3_VERIFY=download" in str(caught.value)
    listed = s3_stand.direct_client().list_objects_v2(Bucket=bucket, Prefix="kms/")
    assert not listed.get("Contents")  # its own unverifiable object is removed
    store.close()
