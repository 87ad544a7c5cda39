"""Secrets masked in text, data and log lines."""

from __future__ import annotations

import io
import json
import logging

from factory.infra import logs, redact

PEM = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49\n-----END PRIVATE KEY-----"


def test_urls_keys_signatures_and_registered_values_are_masked() -> None:
    redact.register_secrets(["wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "abc"])
    text = (
        "postgresql+psycopg2://factory:hunter22@db:5432/factory redis://:s3cret@redis:6379/0 "
        f"key {PEM} url https://gw/b/k?X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F2026&"
        "X-Amz-Signature=deadbeef01 Authorization: AWS4-HMAC-SHA256 "
        "Credential=AKIAIOSFODNN7EXAMPLE/x, Signature=feedface99"
        " secret wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY id AKIAIOSFODNN7EXAMPLE abc"
    )
    masked = redact.redact(text)
    for secret in ("hunter22", "s3cret", "MIGHAgEAMBMGByqGSM49", "deadbeef01",
                   "wJalrXUtnFEMI", "AKIAIOSFODNN7EXAMPLE", "feedface99"):  # fmt: skip
        assert secret not in masked
    assert "postgresql+psycopg2://factory:***@db:5432/factory" in masked
    assert masked.endswith(" abc")  # too short to be registered: ordinary words stay


def test_data_is_masked_recursively() -> None:
    data = {"error": "redis://:pw123456@h/0", "list": ["x", {"k": PEM}], "n": 3}
    masked = redact.redact_value(data)
    assert masked["n"] == 3 and "pw123456" not in json.dumps(masked)
    assert "MIGHAg" not in json.dumps(masked)


def test_log_lines_are_masked_in_text_and_json(monkeypatch) -> None:
    for fmt in ("text", "json"):
        stream = io.StringIO()
        monkeypatch.setattr("sys.stderr", stream)
        logs.configure(fmt)
        log = logging.getLogger("factory.test")
        log.warning("connecting to %s", "redis://:topsecret1@h:6379/0", extra={"url": PEM})
        try:
            raise RuntimeError("postgresql://u:topsecret2@h/db refused")
        except RuntimeError:
            log.exception("failed")
        output = stream.getvalue()
        assert "topsecret1" not in output and "topsecret2" not in output
        assert "MIGHAg" not in output and "redis://:***@h:6379/0" in output
    logging.getLogger().handlers.clear()


def test_passwords_holding_slashes_and_basic_auth_pairs_are_masked() -> None:
    text = ("postgresql://factory:a/b+c/d==@db:5432/factory "
            "rediss://default:x/y?z@redis:6380/0 [redis://:p@ss/w0rd@h/1]")  # fmt: skip
    masked = redact.redact(text)
    for secret in ("a/b+c/d==", "b+c", "x/y?z", "p@ss/w0rd", "w0rd"):
        assert secret not in masked, masked
    assert "postgresql://factory:***@db:5432/factory" in masked
    assert "rediss://default:***@redis:6380/0" in masked
    redact.register_environment({"FACTORY_FLOWER_BASIC_AUTH": "ops:flower-pass-9d2",
                                 "FACTORY_METRICS_TOKEN": "metrics-token-77a"})  # fmt: skip
    line = redact.redact("auth ops:flower-pass-9d2 then flower-pass-9d2 token metrics-token-77a")
    assert "flower-pass-9d2" not in line and "metrics-token-77a" not in line
