"""The S3 test stand: moto's S3 server behind Debian nginx running docker/nginx-mtls.conf, both
on 127.0.0.1, with certificates made by scripts/make-certs (../shared/reference/S3_MTLS_NOTES.md).

`scripts/test` installs nginx-light; moto comes with the dev extra. The stand starts once per
test session and is stopped at its end; tests may stop and start the gateway alone, revoke a
client, set the allow-list (each reloads nginx as an operator would) or start a second gateway
with a brand-new CA. The CA keys live in `ca_dir`, apart from the deployed `certs`.
"""

from __future__ import annotations

import os
import random
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

from factory.config.s3 import S3Settings
from tests.conftest import REPO

ACCESS_KEY = "AKIAFACTORYTEST00001"
SECRET_KEY = "factory-test-secret-Zx81qWv3"  # moto accepts any; scanned for in logs
MAKE_CERTS = REPO / "scripts" / "make-certs"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_port_block(count: int) -> int:
    """The first of `count` consecutive free ports, for a process that binds them itself later
    (a worker pool's health ports). Taken below the kernel's ephemeral range, where neither
    `free_port()` in a parallel test nor an outgoing connection (every Redis and Postgres
    client takes a local port from that range) can land on one before the process binds it."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for base in random.Random().sample(range(max(1024, low - 12000), low - count), 200):
        if all(_bindable(base + i) for i in range(count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports below {low}")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
        return True


def wait_port(port: int, timeout: float = 15, process: subprocess.Popen | None = None) -> None:
    """Until something listens on the port; ``process`` (what should) must not exit first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        if process is not None and process.poll() is not None:
            said = process.stderr.read().decode() if process.stderr else ""
            raise RuntimeError(f"{process.args[0]} exited before it listened: {said}")
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def make_certs(out: Path, *args: str, ca_dir: Path | None = None) -> str:
    """scripts/make-certs with the CA keys in ca_dir (default: out); its stdout."""
    where = ["--ca-dir", str(ca_dir)] if ca_dir else []
    done = subprocess.run(["bash", str(MAKE_CERTS), *where, "--out", str(out), *args],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"make-certs {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def children(pid: int) -> set[int]:
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            found.add(int(stat.parent.name))
    return found


@dataclass
class S3Stand:
    root: Path
    s3_port: int = field(default_factory=free_port)
    gateway_port: int = field(default_factory=free_port)
    moto: subprocess.Popen | None = None
    # The folders below root: the deployed certificates; the CA's keys (ca.key,
    # intermediate.key and the signing databases: never mounted anywhere); the same two of
    # a brand-new CA, apart.
    certs: Path = field(init=False)
    ca_dir: Path = field(init=False)
    other_certs: Path = field(init=False)
    other_ca_dir: Path = field(init=False)

    def __post_init__(self) -> None:
        self.certs, self.ca_dir = self.root / "certs", self.root / "ca"
        self.other_certs, self.other_ca_dir = self.root / "other-ca", self.root / "other-ca-keys"

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
            "include /etc/nginx/conf.d/*.conf;": f"include {self.root}/conf.d/*.conf;",
            "worker_processes auto;": "worker_processes 2;\nuser root root;"
            if os.geteuid() == 0
            else "worker_processes 2;",
        }
        for old, new in swaps.items():
            assert old in text, f"docker/nginx-mtls.conf no longer has {old!r}"
            text = text.replace(old, new)
        (self.root / "conf.d").mkdir(exist_ok=True)  # empty: no other server here
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

    def reload_gateway(self, timeout: float = 10) -> None:
        """`nginx -s reload`, as after a revoke; returns once only new workers are left, so
        every connection from now on is checked with the files as they are now."""
        checked = self._nginx("-t")
        if checked.returncode != 0:
            raise RuntimeError(f"nginx -t refuses the configuration: {checked.stderr}")
        master = int((self.root / "nginx.pid").read_text())
        old = children(master)
        done = self._nginx("-s", "reload")
        if done.returncode != 0:
            raise RuntimeError(f"nginx -s reload failed: {done.stderr}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            workers = children(master)
            if workers and not workers & old:
                return
            time.sleep(0.05)
        log = (self.root / "gateway-error.log").read_text().splitlines()[-5:]
        raise RuntimeError(f"the gateway kept its old workers after a reload: {log}")

    def stop_gateway(self) -> None:
        pid_file = self.root / "nginx.pid"
        if not pid_file.exists():
            return
        pid = int(pid_file.read_text())
        os.kill(pid, signal.SIGTERM)  # fast shutdown: open connections are cut
        # Down means the port refuses: on a loaded machine the master's pid file can go
        # before its last worker has closed the listening socket.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (pid_file.exists() or self._gateway_listens()):
            time.sleep(0.05)
        assert not self._gateway_listens(), "gateway still up"

    def _gateway_listens(self) -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.gateway_port)) == 0

    # --- certificates ----------------------------------------------------------------

    def make_certs(self, *args: str) -> str:
        """scripts/make-certs on this stand's certificates (CA keys in ca_dir)."""
        return make_certs(self.certs, *args, ca_dir=self.ca_dir)

    def _make_certs(self) -> None:
        certs, other = self.certs, self.other_certs
        self.make_certs("ca")
        self.make_certs("intermediate")
        self.make_certs("server", "gateway", "--host", "localhost", "--host", "127.0.0.1")
        self.make_certs("client", "worker")
        self.make_certs("client", "via-intermediate", "--issuer", "intermediate")
        self.make_certs("client", "expired", "--start", "20200101000000Z",
                        "--end", "20210101000000Z")  # fmt: skip
        self.make_certs("client", "not-yet-valid", "--start", "20400101000000Z",
                        "--end", "20410101000000Z")  # fmt: skip
        make_certs(other, "ca", "--name", "some other CA", ca_dir=self.other_ca_dir)
        make_certs(other, "client", "stranger", ca_dir=self.other_ca_dir)
        # the intermediate-issued client without its chain: the gateway cannot verify it
        leaf = (certs / "via-intermediate.pem").read_text().split("-----END CERTIFICATE-----")[0]
        (certs / "no-chain.pem").write_text(leaf + "-----END CERTIFICATE-----\n")
        shutil.copy(certs / "via-intermediate.key", certs / "no-chain.key")

    def issue_client(self, name: str, issuer: str = "ca") -> str:
        self.make_certs("client", name, "--issuer", issuer)
        return name

    def revoke(self, name: str, *options: str) -> str:
        """scripts/make-certs revoke NAME, then the gateway reloaded."""
        out = self.make_certs("revoke", name, *options)
        self.reload_gateway()
        return out

    def set_allow_list(self, names: list[str] | None) -> None:
        """Admit only these clients (None: every valid one), then the gateway reloaded."""
        self.make_certs("allow", "--all")
        for name in names or []:
            self.make_certs("allow", name)
        self.reload_gateway()

    def fresh_gateway(self, root: Path) -> S3Stand:
        """A second gateway in front of this stand's moto, with a brand-new CA that has
        issued its server pair and one client (worker) and revoked nothing."""
        fresh = S3Stand(root, s3_port=self.s3_port)
        fresh.make_certs("ca")
        fresh.make_certs("server", "gateway", "--host", "localhost", "--host", "127.0.0.1")
        fresh.make_certs("client", "worker")
        fresh._write_gateway_config()
        fresh.start_gateway()
        return fresh

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
            for p in sorted([*self.certs.glob("*.key"), *self.ca_dir.glob("*.key")])
        ]
        return [SECRET_KEY, *keys]
