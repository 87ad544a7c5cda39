"""Servers of a test's own: a PostgreSQL cluster (initdb) and a Redis on free ports.

The machine's PostgreSQL and Redis are shared by every test and every pytest worker (each
with its own databases, tests/conftest.py), so no test may stop, restart or flush them. A
test that takes a service down, or needs one set up differently (passwords), starts its own
here and does what it likes with it."""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tests.s3stand import free_port


def _as_postgres(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@dataclass
class PrivateRedis:
    """`redis-server` with its settings in a file (never on its command line)."""

    root: Path
    port: int
    password: str | None = None
    process: subprocess.Popen | None = None

    def url(self, db: int = 0) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/{db}"

    def start(self) -> PrivateRedis:
        conf = self.root / "redis.conf"
        lines = [f"port {self.port}", "bind 127.0.0.1", 'save ""', "appendonly no",
                 f"dir {self.root}"]  # fmt: skip
        if self.password:
            lines.append(f"requirepass {self.password}")
        conf.write_text("\n".join(lines) + "\n")
        conf.chmod(0o600)
        self.process = subprocess.Popen(["redis-server", str(conf)], stdout=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, password=self.password)
        deadline = time.monotonic() + 15
        while True:
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        """As a crash would: no save, connections cut."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def restart(self) -> None:
        self.stop()
        self.start()


def start_redis(root: Path, password: str | None = None) -> PrivateRedis:
    root.mkdir(parents=True, exist_ok=True)
    return PrivateRedis(root, free_port(), password).start()


@dataclass
class PrivatePostgres:
    """A PostgreSQL cluster of its own: its superuser `postgres` has ``admin_password``
    (scram-sha-256 for every connection) or, without one, local trust as the shared server."""

    root: Path
    bin_dir: Path
    port: int
    admin_password: str | None

    @property
    def data(self) -> Path:
        return self.root / "data"

    def ctl(self, *args: str) -> None:
        subprocess.run(_as_postgres([str(self.bin_dir / "pg_ctl"), "-D", str(self.data), *args]),
                       check=True, capture_output=True, timeout=120)  # fmt: skip

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self.ctl("-w", "-l", str(self.root / "log"), "-o", options, "start")

    def restart(self) -> None:
        self.ctl("-w", "-m", "fast", "-l", str(self.root / "log"), "restart")

    def stop(self) -> None:
        subprocess.run(_as_postgres([str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m",
                                     "immediate", "stop"]), capture_output=True)  # fmt: skip
        shutil.rmtree(self.root, ignore_errors=True)

    def sql(self, statement: str) -> None:
        env = {**os.environ, **({"PGPASSWORD": self.admin_password} if self.admin_password else {})}
        subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d",
                        "postgres", "-v", "ON_ERROR_STOP=1", "-c", statement],
                       env=env, check=True, capture_output=True)  # fmt: skip

    def url(self, database: str = "postgres", user: str = "postgres",
            password: str | None = None) -> str:  # fmt: skip
        auth = f"{user}:{password}" if password else user
        return f"postgresql+psycopg2://{auth}@127.0.0.1:{self.port}/{database}"


def start_postgres(admin_password: str | None = None) -> PrivatePostgres:
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[4]))
    if not bins:
        pytest.fail("PostgreSQL's server binaries are not installed", pytrace=False)
    # Under /tmp, not pytest's folder: the postgres user must reach it, and a socket path is
    # limited to about 100 characters.
    root = Path(tempfile.mkdtemp(prefix="pg-own-", dir="/tmp"))
    root.chmod(0o755)
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    server = PrivatePostgres(root, Path(bins[-1]), free_port(), admin_password)
    if admin_password:
        pwfile = root / "pw"
        pwfile.write_text(admin_password + "\n")
        if os.geteuid() == 0:
            shutil.chown(pwfile, "postgres", "postgres")
        auth = ["--auth=scram-sha-256", f"--pwfile={pwfile}"]
    else:
        auth = ["--auth=trust"]
    subprocess.run(_as_postgres([str(server.bin_dir / "initdb"), "-D", str(server.data), "-U",
                                 "postgres", "--no-sync", *auth]),
                   check=True, capture_output=True)  # fmt: skip
    server.start()
    return server


def new_password(prefix: str) -> str:
    return f"{prefix}-{secrets.token_urlsafe(18)}"
