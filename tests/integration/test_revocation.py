"""Revocable client certificates: scripts/make-certs revoke/crl/allow against the real gateway
(Debian nginx running docker/nginx-mtls.conf, reloaded as an operator would) in front of moto
(tests/s3stand.py). Certificates revoked here are issued here: the stand is shared."""

from __future__ import annotations

import socket
import ssl
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from factory.errors import PermanentError
from factory.store.s3 import S3Store
from tests.s3stand import MAKE_CERTS

REVOKED = "FAILED:certificate revoked"


@dataclass
class Answer:
    status: int
    verdict: str  # X-Client-Verify
    body: str
    resumed: bool


def client_context(stand, name: str) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(stand.certs / "ca.pem"))
    context.load_cert_chain(stand.certs / f"{name}.pem", stand.certs / f"{name}.key")
    return context


def ask(stand, name: str, context: ssl.SSLContext | None = None, session=None) -> Answer:
    """One GET / through the gateway with NAME's certificate, on a connection of its own."""
    context = context or client_context(stand, name)
    with (
        socket.create_connection(("127.0.0.1", stand.gateway_port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1", session=session) as tls,
    ):
        tls.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
        resumed = tls.session_reused
    head, _, body = data.decode().partition("\r\n\r\n")
    lines = head.split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return Answer(int(lines[0].split()[1]), headers.get("X-Client-Verify", ""), body, resumed)


def refusal(stand, bucket: str, name: str) -> str:
    """The factory's own S3 store with NAME's certificate: its permanent error, not retried."""
    store = S3Store(f"s3://{bucket}", stand.settings(name, attempts=5, backoff=5.0))
    started = time.monotonic()
    with pytest.raises(PermanentError) as raised:
        store.put_bytes("refused", b"x")
    assert time.monotonic() - started < 4  # not retried (a retry would wait 5 s)
    return str(raised.value)


def works(stand, bucket: str, name: str) -> None:
    key = f"ok/{name}"
    S3Store(f"s3://{bucket}", stand.settings(name)).put_bytes(key, name.encode())
    body = stand.direct_client().get_object(Bucket=bucket, Key=key)["Body"].read()
    assert body == name.encode()


def new_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def make_certs(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(MAKE_CERTS), *args], capture_output=True, text=True)


def crls(path: Path) -> int:
    return path.read_text().count("-----BEGIN X509 CRL-----")


def test_a_revoked_client_is_refused_with_its_verdict_and_the_others_still_work(
    s3_stand, bucket
) -> None:
    name, other = s3_stand.issue_client(new_name("leaked")), s3_stand.issue_client(new_name("ok"))
    works(s3_stand, bucket, name)
    assert ask(s3_stand, name).status == 200

    said = s3_stand.revoke(name, "--reason", "keyCompromise")
    assert "reload the gateway" in said

    answer = ask(s3_stand, name)
    assert answer.status == 403 and answer.verdict == REVOKED
    assert f"the gateway rejected the client certificate: {REVOKED}" in answer.body
    message = refusal(s3_stand, bucket, name)
    assert f"rejected the client certificate ({REVOKED})" in message
    assert "was revoked: issue this node a new one" in message  # the advice fits the verdict
    assert "certificate revoked" in (s3_stand.root / "gateway-error.log").read_text()
    for unrevoked in (other, "worker", "via-intermediate"):
        works(s3_stand, bucket, unrevoked)
    index = (s3_stand.ca_dir / ".ca-ca" / "index.txt").read_text().splitlines()
    assert [line[0] for line in index if line.endswith(f"CN={name}/O=video factory")] == ["R"]


def test_a_client_of_the_intermediate_is_revocable_too(s3_stand, bucket) -> None:
    name = s3_stand.issue_client(new_name("chained"), issuer="intermediate")
    works(s3_stand, bucket, name)
    assert crls(s3_stand.certs / "crl.pem") == 2  # the root's and the intermediate's

    s3_stand.revoke(name)

    answer = ask(s3_stand, name)
    assert answer.status == 403 and answer.verdict == REVOKED
    assert REVOKED in refusal(s3_stand, bucket, name)
    works(s3_stand, bucket, "via-intermediate")  # same intermediate, not revoked


def test_a_tls_session_from_before_the_revocation_is_not_resumed(s3_stand) -> None:
    name = s3_stand.issue_client(new_name("resumer"))
    context = client_context(s3_stand, name)
    context.maximum_version = ssl.TLSVersion.TLSv1_2  # resumable session ids
    context.options |= ssl.OP_NO_TICKET
    before = socket.create_connection(("127.0.0.1", s3_stand.gateway_port), timeout=10)
    with context.wrap_socket(before, server_hostname="127.0.0.1") as tls:
        tls.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        while tls.recv(65536):
            pass
        session = tls.session

    s3_stand.revoke(name)

    answer = ask(s3_stand, name, context, session)
    assert not answer.resumed
    assert answer.status == 403 and answer.verdict == REVOKED


def test_an_expired_crl_refuses_every_client_until_it_is_renewed(s3_stand, bucket) -> None:
    s3_stand.make_certs("crl", "--start", "20200101000000Z", "--end", "20200201000000Z")
    try:
        s3_stand.reload_gateway()
        for name in ("worker", "via-intermediate"):
            answer = ask(s3_stand, name)
            assert answer.status == 403 and answer.verdict == "FAILED:CRL has expired"
        message = refusal(s3_stand, bucket, "worker")
        assert "rejected the client certificate (FAILED:CRL has expired)" in message
        assert "`scripts/make-certs crl`, then reload the gateway" in message
        assert "issue a new one" not in message  # the certificate is fine: renew the CRL
    finally:
        said = s3_stand.make_certs("crl")  # the monthly renewal
        s3_stand.reload_gateway()
    assert "nextUpdate" in said
    works(s3_stand, bucket, "worker")
    works(s3_stand, bucket, "via-intermediate")


def test_the_allow_list_admits_only_the_subjects_on_it(s3_stand, bucket) -> None:
    listed, unlisted = (s3_stand.issue_client(new_name(n)) for n in ("listed", "unlisted"))
    try:
        s3_stand.set_allow_list([listed, "via-intermediate"])
        works(s3_stand, bucket, listed)
        works(s3_stand, bucket, "via-intermediate")
        verdict = f"NOT-ALLOWED:O=video factory,CN={unlisted}"
        answer = ask(s3_stand, unlisted)
        assert answer.status == 403 and answer.verdict == verdict
        assert f"the gateway rejected the client certificate: {verdict}" in answer.body
        message = refusal(s3_stand, bucket, unlisted)
        assert f"rejected the client certificate ({verdict})" in message
        assert "allow-list (clients.map)" in message
        # a certificate that fails its checks is named by that failure, listed or not
        assert ask(s3_stand, "expired").verdict == "FAILED:certificate has expired"

        s3_stand.make_certs("disallow", listed)
        s3_stand.reload_gateway()
        assert ask(s3_stand, listed).verdict == f"NOT-ALLOWED:O=video factory,CN={listed}"
    finally:
        s3_stand.set_allow_list(None)
    works(s3_stand, bucket, unlisted)  # the list dropped: every valid certificate again


def test_a_fresh_ca_works_out_of_the_box_and_keeps_its_keys_apart(
    s3_stand, bucket, tmp_path
) -> None:
    fresh = s3_stand.fresh_gateway(tmp_path)
    try:
        works(fresh, bucket, "worker")  # an initial, empty CRL and the permissive allow-list
        assert crls(fresh.certs / "crl.pem") == 1
        assert "default 1;" in (fresh.certs / "clients.map").read_text()
    finally:
        fresh.stop_gateway()
    for stand in (fresh, s3_stand):
        deployed = {p.name for p in stand.certs.iterdir()}
        assert not deployed & {"ca.key", "intermediate.key", ".ca-ca", ".ca-intermediate"}
        assert {"ca.pem", "crl.pem", "clients.map"} <= deployed
        assert (stand.ca_dir / "ca.key").stat().st_mode & 0o777 == 0o600
        assert (stand.ca_dir / ".ca-ca" / "index.txt").exists()
    assert (s3_stand.ca_dir / "intermediate.key").exists()


def test_revoking_what_the_ca_did_not_issue_exits_2_and_says_why(s3_stand) -> None:
    where = ["--ca-dir", str(s3_stand.ca_dir), "--out", str(s3_stand.certs)]
    crl_before = (s3_stand.certs / "crl.pem").read_text()

    unknown = make_certs(*where, "revoke", "no-such-client")
    assert unknown.returncode == 2
    assert "no certificate 'no-such-client'" in unknown.stderr
    assert f"{s3_stand.certs}/no-such-client.pem does not exist" in unknown.stderr

    stranger = make_certs(*where, "revoke", str(s3_stand.other_certs / "stranger.pem"))
    assert stranger.returncode == 2
    assert f"was not issued from {s3_stand.ca_dir}" in stranger.stderr

    bad_reason = make_certs(*where, "revoke", "worker", "--reason", "bored")
    assert bad_reason.returncode == 2 and "--reason must be" in bad_reason.stderr
    assert (s3_stand.certs / "crl.pem").read_text() == crl_before
