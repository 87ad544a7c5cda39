"""How the S3 store reads a TLS failure, for each kind the gateway or the files can cause:
the ones no retry can fix are permanent and say what to check; a connection that broke is
retried. The S3 stand's tests (tests/integration/test_s3_store.py) meet these through nginx,
but which one a stopped gateway gives depends on when it stops; here each is certain."""

from __future__ import annotations

from pathlib import Path

import pytest
from botocore.exceptions import SSLError

from factory.config.s3 import S3Settings
from factory.errors import PermanentError
from factory.store.s3 import S3Store


class _NoClient:
    def close(self) -> None:
        pass


@pytest.fixture
def store() -> S3Store:
    settings = S3Settings(endpoint_url="https://gateway:9443", ca_bundle=Path("/pki/ca.pem"),
                          client_cert=Path("/pki/worker.pem"))  # fmt: skip
    return S3Store("s3://bucket", settings, client=_NoClient())


def _ssl(text: str) -> SSLError:
    return SSLError(endpoint_url="https://gateway:9443", error=text)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed", "is not trusted"),
        ("[X509: KEY_VALUES_MISMATCH] key values mismatch", "is not the key of"),
        ("[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required",
         "refused the handshake"),
        ("[SSL: SSLV3_ALERT_CERTIFICATE_REVOKED] sslv3 alert certificate revoked",
         "refused the handshake"),
        ("[Errno 2] No such file or directory", "cannot be loaded"),
        ("[SSL] PEM lib (_ssl.c:3900)", "cannot be loaded"),
    ],
)  # fmt: skip
def test_a_tls_failure_no_retry_can_fix_is_permanent_and_names_what_to_check(
    store: S3Store, text: str, says: str
) -> None:
    with pytest.raises(PermanentError, match=says) as raised:
        store._classify(_ssl(text))
    # what to check: the endpoint and the certificate in use, by path (never a secret)
    assert "endpoint https://gateway:9443" in str(raised.value)
    assert "client certificate /pki/worker.pem" in str(raised.value)


def test_a_tls_connection_that_broke_is_retried(store: S3Store) -> None:
    reason = store._classify(_ssl("[SSL: UNEXPECTED_EOF_WHILE_READING] EOF occurred"))
    assert reason.startswith("TLS connection broke (")
