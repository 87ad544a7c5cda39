"""The S3 test stand: moto's S3 server behind Debian nginx running docker/nginx-mtls.conf, both
on 127.0.0.1, with certificates made by scripts/make-certs (../shared/reference/S3_MTLS_NOTES.md).

`scripts/test` installs nginx-light; moto comes with the dev extra. The stand starts once per
test session and is stopped at its end; tests may stop and start the gateway alone.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from factory.store.s3_settings import S3Settings
from tests.conftest import REPO

ACCESS_KEY = "AKIAFACTORYTEST00001"
SECRET_KEY = "factory-test-secret-Zx81qWv3"  # moto accepts any; scanned for in logs
MAKE_CERTS = REPO / "scripts" / "make-certs"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_port(port: int, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def make_certs(out: Path, *args: str) -> None:
    subprocess.run(["bash", str(MAKE_CERTS), "--out", str(out), *args], check=True,
                   capture_output=True)  # fmt: skip


@dataclass
class S3Stand:
    root: Path
    s3_port: int = field(default_factory=free_port)
    gateway_port: int = field(default_factory=free_port)
    moto: subprocess.Popen | None = None

    @property
    def certs(self) -> Path:
        return self.root / "certs"

    @property
    def other_certs(self) -> Path:
        return self.root / "other-ca"

    @property
    def endpoint(self) -> str:
        return f"https://127.0.0.1:{self.gateway_port}"

    @property
    def direct_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def start(self) -> None:
        if shutil.which("nginx") is None:
            raise RuntimeError("nginx is not installed; `scripts/test` installs nginx-light")
        self._make_certs()
        log = open(self.root / "moto.log", "ab")  # noqa: SIM115 - lives as long as moto
        self.moto = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.s3_port)],
            stdout=log, stderr=log, start_new_session=True,
        )  # fmt: skip
        wait_port(self.s3_port)
        self._write_gateway_config()
        self.start_gateway()

    def stop(self) -> None:
        self.stop_gateway()
        if self.moto and self.moto.poll() is None:
            os.killpg(self.moto.pid, signal.SIGTERM)
            self.moto.wait(10)

    # --- the gateway: the production config with this stand's paths and ports --------

    def _write_gateway_config(self) -> None:
        text = (REPO / "docker" / "nginx-mtls.conf").read_text()
        swaps = {
            "pid /tmp/nginx-mtls.pid;": f"pid {self.root}/nginx.pid;",
            "error_log /dev/stderr info;": f"error_log {self.root}/gateway-error.log info;",
            "access_log /dev/stdout s3;": f"access_log {self.root}/gateway-access.log s3;",
            "/tmp/nginx-mtls-": f"{self.root}/nginx-",
            "server minio:9000;": f"server 127.0.0.1:{self.s3_port};",
            "listen 8443 ssl;": f"listen 127.0.0.1:{self.gateway_port} ssl;",
            "/etc/nginx/certs/": f"{self.certs}/",
            "worker_processes auto;": "worker_processes 2;\nuser root root;"
            if os.geteuid() == 0
            else "worker_processes 2;",
        }
        for old, new in swaps.items():
            assert old in text, f"docker/nginx-mtls.conf no longer has {old!r}"
            text = text.replace(old, new)
        (self.root / "nginx.conf").write_text(text)

    def _nginx(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["nginx", "-p", str(self.root), "-e", str(self.root / "gateway-error.log"),
             "-c", str(self.root / "nginx.conf"), *args],
            capture_output=True, text=True,
        )  # fmt: skip

    def start_gateway(self) -> None:
        done = self._nginx()
        if done.returncode != 0:
            raise RuntimeError(f"nginx did not start: {done.stderr}")
        wait_port(self.gateway_port)

    def stop_gateway(self) -> None:
        pid_file = self.root / "nginx.pid"
        if not pid_file.exists():
            return
        pid = int(pid_file.read_text())
        os.kill(pid, signal.SIGTERM)  # fast shutdown: open connections are cut
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and pid_file.exists():
            time.sleep(0.05)
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", self.gateway_port)) != 0, "gateway still up"

    # --- certificates ----------------------------------------------------------------

    def _make_certs(self) -> None:
        certs, other = self.certs, self.other_certs
        make_certs(certs, "ca")
        make_certs(certs, "intermediate")
        make_certs(certs, "server", "gateway", "--host", "localhost", "--host", "127.0.0.1")
        make_certs(certs, "client", "worker")
        make_certs(certs, "client", "via-intermediate", "--issuer", "intermediate")
        make_certs(certs, "client", "expired", "--start", "20200101000000Z",
                   "--end", "20210101000000Z")  # fmt: skip
        make_certs(certs, "client", "not-yet-valid", "--start", "20400101000000Z",
                   "--end", "20410101000000Z")  # fmt: skip
        make_certs(other, "ca", "--name", "some other CA")
        make_certs(other, "client", "stranger")
        # the intermediate-issued client without its chain: the gateway cannot verify it
        leaf = (certs / "via-intermediate.pem").read_text().split("-----END CERTIFICATE-----")[0]
        (certs / "no-chain.pem").write_text(leaf + "-----END CERTIFICATE-----\n")
        shutil.copy(certs / "via-intermediate.key", certs / "no-chain.key")

    # --- clients ---------------------------------------------------------------------

    def settings(self, client: str | None = "worker", **overrides: object) -> S3Settings:
        base = self.other_certs if client == "stranger" else self.certs
        values: dict[str, object] = dict(
            endpoint_url=self.endpoint,
            ca_bundle=self.certs / "ca.pem",
            client_cert=base / f"{client}.pem" if client else None,
            client_key=base / f"{client}.key" if client else None,
            multipart_bytes=6 << 20,
            part_bytes=5 << 20,
            attempts=3,
            backoff=0.05,
            scratch=self.root / "scratch",
        )
        values.update(overrides)
        return S3Settings(**values)  # type: ignore[arg-type]

    def env(self, url: str, client: str = "worker", **extra: str) -> dict[str, str]:
        """FACTORY_* and AWS_* for a factory process that uses the stand through the gateway."""
        return {
            "FACTORY_STORE_URL": url,
            "FACTORY_S3_ENDPOINT_URL": self.endpoint,
            "FACTORY_S3_CA": str(self.certs / "ca.pem"),
            "FACTORY_S3_CLIENT_CERT": str(self.certs / f"{client}.pem"),
            "FACTORY_S3_CLIENT_KEY": str(self.certs / f"{client}.key"),
            "FACTORY_S3_ATTEMPTS": "2",
            "FACTORY_S3_BACKOFF": "0.1",
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": "us-east-1",
            **extra,
        }

    def direct_client(self) -> Any:
        """Straight to moto over http, around the gateway: what is really stored."""
        return boto3.client(
            "s3", endpoint_url=self.direct_endpoint, region_name="us-east-1",
            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
            config=Config(s3={"addressing_style": "path"}),
        )  # fmt: skip

    def make_bucket(self, name: str) -> str:
        self.direct_client().create_bucket(Bucket=name)
        return name

    def secrets(self) -> list[str]:
        """Strings that must never appear in a log, an error, an event or a report."""
        keys = [
            p.read_text().split("-----BEGIN PRIVATE KEY-----\n")[1].splitlines()[0]
            for p in sorted(self.certs.glob("*.key"))
        ]
        return [SECRET_KEY, *keys]
