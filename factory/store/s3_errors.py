"""How the S3 store reads a failed request (factory/store/s3.py): certificate and TLS
failures, refused credentials and missing buckets are PermanentError with a message that says
what to check; connection errors, 5xx and bytes that arrived corrupted are a short reason to
retry with."""

from __future__ import annotations

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    NoCredentialsError,
    SSLError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from factory.config.s3 import S3Settings
from factory.errors import PermanentError

_RETRYABLE_CODES = {"SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable",
                    "RequestTimeTooSkewed", "503", "502", "504", "500"}  # fmt: skip
_CREDENTIAL_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied",
                     "InvalidToken", "ExpiredToken"}  # fmt: skip
_HANDSHAKE_REJECTIONS = ("certificate required", "unknown ca", "bad certificate",
                         "certificate expired", "certificate unknown", "access denied",
                         "certificate revoked", "handshake failure")  # fmt: skip


class Corrupt(Exception):
    """Bytes that arrived differently from how they left: worth another attempt."""


def classify(exc: Exception, settings: S3Settings, url: str, bucket: str) -> str:
    """A short reason for a retryable failure; raises PermanentError for the rest."""
    check = settings.describe()
    if isinstance(exc, Corrupt):
        return str(exc)
    if isinstance(exc, SSLError):
        return _tls_reason(str(exc), check)
    if isinstance(exc, NoCredentialsError):
        raise PermanentError(
            "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or "
            "AWS_PROFILE) for the workers"
        ) from None
    if isinstance(exc, (BotoConnectionError, HTTPClientError)):
        return f"cannot reach the S3 endpoint ({_tail(str(exc))}; {check})"
    if isinstance(exc, ClientError):
        return _answer_reason(exc, check, url, bucket)
    if isinstance(exc, BotoCoreError):
        raise PermanentError(f"S3 client error: {_tail(str(exc))} ({check})") from None
    raise exc


def _tls_reason(text: str, check: str) -> str:
    """A TLS failure: permanent when the certificates or keys are wrong or the gateway
    refused the handshake; a reason to retry when the connection merely broke."""
    lowered = text.lower()
    if "certificate_verify_failed" in lowered or "certificate verify failed" in lowered:
        raise PermanentError(
            "TLS: the S3 endpoint's certificate is not trusted: check FACTORY_S3_CA "
            "and that the gateway's certificate names the host of "
            f"FACTORY_S3_ENDPOINT_URL ({check})"
        ) from None
    if "key_values_mismatch" in lowered or "key values mismatch" in lowered:
        raise PermanentError(
            f"TLS: FACTORY_S3_CLIENT_KEY is not the key of FACTORY_S3_CLIENT_CERT ({check})"
        ) from None
    if any(alert in lowered for alert in _HANDSHAKE_REJECTIONS):
        raise PermanentError(
            f"TLS: the gateway refused the handshake ({_tail(text)}): check that "
            f"FACTORY_S3_CLIENT_CERT is valid now and issued by a CA the gateway "
            f"trusts ({check})"
        ) from None
    if "no such file" in lowered or "pem lib" in lowered:
        raise PermanentError(
            f"TLS: the client certificate or key cannot be loaded ({check})"
        ) from None
    return f"TLS connection broke ({_tail(text)})"


def _answer_reason(exc: ClientError, check: str, url: str, bucket: str) -> str:
    """An S3 error answer: permanent for a rejected client certificate, refused credentials,
    a missing bucket or any other 4xx; a reason to retry for 5xx, throttling and clock skew."""
    status, code = http_status(exc), error_code(exc)
    message = exc.response.get("Error", {}).get("Message", "")
    verdict = _header(exc, "x-client-verify")
    if code == "ClientCertificateRejected" or verdict:
        verdict = verdict or message.rsplit(": ", 1)[-1]
        raise PermanentError(
            f"the gateway rejected the client certificate ({verdict}): "
            f"{_certificate_advice(verdict)} ({check})"
        ) from None
    if status == 400 and code == "400":
        raise PermanentError(
            "the endpoint answered HTTP 400 with no S3 error, as a gateway does when it "
            "rejects the client certificate: check FACTORY_S3_CLIENT_CERT and "
            f"FACTORY_S3_CLIENT_KEY ({check})"
        ) from None
    if code in _CREDENTIAL_CODES or (status == 403 and code == "403"):
        raise PermanentError(
            f"S3 refused the credentials ({code}): check AWS_ACCESS_KEY_ID / "
            f"AWS_SECRET_ACCESS_KEY and the bucket policy for {url}"
        ) from None
    if code == "NoSuchBucket":
        raise PermanentError(
            f"bucket {bucket!r} does not exist at {check}; create it first"
        ) from None
    if code == "RequestTimeTooSkewed":
        return (
            f"S3 answered {status} {code}: this node's clock is too far from the "
            "store's; check its time synchronisation (NTP)"
        )
    if status >= 500 or code in _RETRYABLE_CODES:
        return f"S3 answered {status} {code}"
    raise PermanentError(f"S3 answered {status} {code}: {message}") from None


def http_status(exc: ClientError) -> int:
    """The HTTP status of an S3 answer (0 if none)."""
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def error_code(exc: ClientError) -> str:
    """The S3 error code of an answer ("" if none)."""
    return str(exc.response.get("Error", {}).get("Code", ""))


def _header(exc: ClientError, name: str) -> str:
    """A header of the answer ("" if absent)."""
    headers = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders", {}) or {}
    return str(headers.get(name, ""))


def _certificate_advice(verdict: str) -> str:
    """What to do about a client certificate the gateway rejected, by its verdict."""
    lowered = verdict.lower()
    if verdict == "NONE":
        return (
            "no client certificate was sent: set FACTORY_S3_CLIENT_CERT and FACTORY_S3_CLIENT_KEY"
        )
    if verdict.startswith("NOT-ALLOWED"):
        return (
            "FACTORY_S3_CLIENT_CERT is valid but not on the gateway's allow-list "
            "(clients.map): `scripts/make-certs allow NAME`, then reload the gateway"
        )
    if "revoked" in lowered:
        return (
            "FACTORY_S3_CLIENT_CERT was revoked: issue this node a new one "
            "(scripts/make-certs client)"
        )
    if "crl" in lowered:  # "CRL has expired", "unable to get certificate CRL"
        return (
            "the gateway's revocation list is expired or missing, so it refuses every client: "
            "`scripts/make-certs crl`, then reload the gateway (nginx -s reload)"
        )
    if "expired" in lowered:
        return "FACTORY_S3_CLIENT_CERT has expired: issue a new one (scripts/make-certs client)"
    if "not yet valid" in lowered:
        return (
            "FACTORY_S3_CLIENT_CERT is not valid yet: check this node's clock and the "
            "certificate's start date"
        )
    return (
        "FACTORY_S3_CLIENT_CERT is not issued by a CA the gateway trusts, or was sent "
        "without its intermediate CA (append the intermediate to the certificate file)"
    )


def _tail(text: str) -> str:
    """The last line of an error's text, at most 200 characters."""
    return text.strip().splitlines()[-1][-200:] if text.strip() else "no detail"
