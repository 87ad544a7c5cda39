"""The production path an operator follows (README, docs/deploy.md, docs/operations.md), run the
way cron and systemd would run it: one env file that both read, cron scripts that refuse to
submit without it or to the embedded database of a production host, the CRL renewed and the
gateway reloaded from cron, one bucket and prefix everywhere, and a systemd unit for every
long-running service with a gateway config for bare metal. No systemd runs here:
`systemd-analyze verify` checks the units against a temporary root."""

from __future__ import annotations

import datetime
import fnmatch
import http.client
import json
import os
import re
import shutil
import socket
import sqlite3
import ssl
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from factory.config import Settings
from factory.errors import FactoryError
from tests.conftest import REPO
from tests.s3stand import wait_port

SCRIPTS = REPO / "scripts"
SYSTEMD = REPO / "docker" / "systemd"
ENV_FILE = "/etc/factory/factory.env"
CRON = {"PATH": "/usr/bin:/bin", "SHELL": "/bin/sh", "LOGNAME": "root"}  # what cron gives
PRODUCTION_READY = {
    "FACTORY_DATABASE_URL": "postgresql+psycopg2://factory:pw@db.invalid/factory",
    "FACTORY_BROKER_URL": "redis://:pw@redis.invalid:6379/0",
    "FACTORY_STORE_URL": "s3://factory/renders",
}


def _cron_run(argv: list[str], env: dict[str, str], home: Path) -> subprocess.CompletedProcess:
    """argv under `env -i` with cron's environment, from /."""
    pairs = [f"{k}={v}" for k, v in {**CRON, "HOME": str(home), **env}.items()]
    return subprocess.run(["env", "-i", *pairs, *argv], cwd="/", capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip


def _write_env(path: Path, values: dict[str, str]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return path


def _batches(home: Path) -> list[str]:
    db = home / "factory.db"
    if not db.exists():
        return []
    with sqlite3.connect(db) as conn:
        return [row[0] for row in conn.execute("SELECT DISTINCT batch FROM jobs")]


# --- 1. one env file, and cron that refuses the wrong place ----------------------------------


@pytest.fixture
def night(tmp_path: Path) -> dict[str, Path]:
    """A manifest whose asset the node may read, a FACTORY_HOME, and a HOME apart from it."""
    for name in ("home", "user"):
        (tmp_path / name).mkdir()
    shutil.copytree(REPO / "examples" / "assets", tmp_path / "assets")
    shutil.copy(REPO / "examples" / "quick.yaml", tmp_path / "quick.yaml")
    return {"root": tmp_path, "manifest": tmp_path / "quick.yaml", "home": tmp_path / "home",
            "user": tmp_path / "user"}  # fmt: skip


def _nightly(night: dict[str, Path], env: dict[str, str]) -> subprocess.CompletedProcess:
    cli = {"FACTORY_CLI": str(REPO / ".venv" / "bin" / "factory")}
    return _cron_run([str(SCRIPTS / "nightly.sh"), str(night["manifest"]), "nightly"],
                     {**cli, **env}, night["user"])  # fmt: skip


def test_nightly_with_the_env_file_submits_where_the_file_says(night: dict[str, Path]) -> None:
    """The control: FACTORY_HOME comes from the env file alone, and the batch lands there."""
    env_file = _write_env(night["root"] / "factory.env", {
        "FACTORY_HOME": str(night["home"]), "FACTORY_ASSET_ROOTS": str(night["root"])})  # fmt: skip
    done = _nightly(night, {"FACTORY_ENV_FILE": str(env_file)})
    assert done.returncode == 0, done.stderr
    assert _batches(night["home"]) == [f"nightly-{datetime.date.today():%Y-%m-%d}"]
    assert not (night["user"] / ".factory").exists()


def test_nightly_and_factory_cron_take_the_cli_the_env_file_names(night: dict[str, Path]) -> None:
    """FACTORY_CLI set in the env file (issue 50, item 6): factory-cron read it after loading
    the file, nightly.sh before, and ran another factory than the file names."""
    called = night["root"] / "called"
    fake = night["root"] / "fake-factory"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {called}\n')
    fake.chmod(0o755)
    env_file = _write_env(night["root"] / "factory.env", {
        "FACTORY_HOME": str(night["home"]), "FACTORY_ASSET_ROOTS": str(night["root"]),
        "FACTORY_CLI": str(fake)})  # fmt: skip
    for argv in ([str(SCRIPTS / "nightly.sh"), str(night["manifest"]), "nightly"],
                 [str(SCRIPTS / "factory-cron"), "status"]):  # fmt: skip
        done = _cron_run(argv, {"FACTORY_ENV_FILE": str(env_file)}, night["user"])
        assert done.returncode == 0, (argv, done.stderr)
    said = called.read_text().splitlines()
    assert any(line.startswith("submit ") for line in said[:-1]) and said[-1] == "status", said


def test_nightly_without_the_env_file_refuses_and_submits_nothing(night: dict[str, Path]) -> None:
    missing = night["root"] / "nowhere" / "factory.env"
    done = _nightly(night, {"FACTORY_ENV_FILE": str(missing), "FACTORY_HOME": str(night["home"])})
    assert done.returncode != 0
    assert str(missing) in done.stderr
    assert _batches(night["home"]) == [] and _batches(night["user"] / ".factory") == []
    if not Path(ENV_FILE).exists():  # the default path, named in the refusal
        done = _nightly(night, {"FACTORY_HOME": str(night["home"])})
        assert done.returncode != 0 and ENV_FILE in done.stderr
        assert _batches(night["home"]) == []


@pytest.mark.parametrize(
    ("named", "value"),
    [
        ("FACTORY_DATABASE_URL", ""),
        ("FACTORY_DATABASE_URL", "sqlite:///{home}/factory.db"),
        ("FACTORY_STORE_URL", "file://{home}/store"),
        ("FACTORY_STORE_URL", ""),
        ("FACTORY_BROKER_URL", ""),
    ],
    ids=["no-database", "sqlite", "file-store", "no-store", "no-broker"],
)
def test_nightly_on_a_production_host_refuses_the_embedded_factory(
    night: dict[str, Path], named: str, value: str
) -> None:
    """NAMED set to VALUE (the embedded factory's, or none) in the env file: refused, by name."""
    values = {"FACTORY_PRODUCTION": "1", "FACTORY_HOME": str(night["home"]), **PRODUCTION_READY}
    values[named] = value.format(home=night["home"])
    env_file = _write_env(night["root"] / "factory.env", values)
    done = _nightly(night, {"FACTORY_ENV_FILE": str(env_file)})
    assert done.returncode != 0
    assert str(env_file) in done.stderr and named in done.stderr, done.stderr
    assert "submitting" not in done.stdout
    assert _batches(night["home"]) == []


def test_an_env_file_that_systemd_and_the_shell_read_differently_is_refused(
    night: dict[str, Path],
) -> None:
    env_file = night["root"] / "factory.env"
    two = "FACTORY_NODE_NAME=gpu-node-1  FACTORY_NODES=gpu-node-1,gpu-node-2"
    env_file.write_text(f"FACTORY_HOME={night['home']}\n{two}\n")
    done = _nightly(night, {"FACTORY_ENV_FILE": str(env_file)})
    assert done.returncode != 0
    assert f"{env_file}:2" in done.stderr, done.stderr
    assert _batches(night["home"]) == []


def test_the_settings_refuse_the_embedded_factory_on_a_production_host(tmp_path: Path) -> None:
    """Every command and service, not only cron: factory.config says no."""
    home = {"FACTORY_HOME": str(tmp_path)}
    assert Settings.from_env(home).is_embedded_database  # not production: embedded is fine
    assert Settings.from_env({**home, "FACTORY_PRODUCTION": "0"}).is_embedded_database
    ready = {**home, "FACTORY_PRODUCTION": "1", **PRODUCTION_READY}
    assert not Settings.from_env(ready).is_embedded_database
    for name, value in (("FACTORY_DATABASE_URL", ""), ("FACTORY_DATABASE_URL", "sqlite:///x.db"),
                        ("FACTORY_STORE_URL", ""), ("FACTORY_STORE_URL", f"file://{tmp_path}"),
                        ("FACTORY_BROKER_URL", "")):  # fmt: skip
        with pytest.raises(FactoryError) as refused:
            Settings.from_env({**ready, name: value})
        assert name in str(refused.value) and "FACTORY_PRODUCTION" in str(refused.value)
    with pytest.raises(FactoryError, match="FACTORY_PRODUCTION"):
        Settings.from_env({**ready, "FACTORY_PRODUCTION": "maybe"})


def _systemd_values(text: str) -> dict[str, str]:
    """An EnvironmentFile as systemd reads it (src/basic/env-file.c): one KEY=VALUE a line,
    whole-line comments; a value in single quotes is literal, in double quotes with backslash
    escapes; an unquoted value is the rest of the line, trailing blanks dropped."""
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        key, _, raw = line.partition("=")
        raw = raw.lstrip()
        if raw[:1] == "'" and raw.endswith("'") and len(raw) > 1:
            values[key.strip()] = raw[1:-1]
        elif raw[:1] == '"' and raw.endswith('"') and len(raw) > 1:
            values[key.strip()] = re.sub(r"\\(.)", r"\1", raw[1:-1])
        else:
            values[key.strip()] = re.sub(r"\\(.)", r"\1", raw).rstrip()
    return values


def _shell_values(path: Path) -> dict[str, str]:
    """The same file as nightly.sh reads it: sourced with set -a."""
    script = 'set -a; . "$1"; set +a; env -0'
    done = subprocess.run(["env", "-i", "bash", "-c", script, "_", str(path)],
                          capture_output=True, check=True)  # fmt: skip
    found = dict(item.split("=", 1) for item in done.stdout.decode().split("\0") if "=" in item)
    return {k: v for k, v in found.items() if k not in ("PWD", "SHLVL", "_", "OLDPWD")}


def _readme_env_block() -> str:
    """The README's env file example: the code block of plain FACTORY_STORE_URL=... lines."""
    blocks = re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    [block] = [b for b in blocks if b.startswith("FACTORY_STORE_URL=")]
    return block


def test_the_shipped_env_files_read_the_same_in_systemd_and_the_shell(tmp_path: Path) -> None:
    example = SYSTEMD / "factory.env.example"
    readme = tmp_path / "readme.env"
    readme.write_text(_readme_env_block())
    for path in (example, readme):
        systemd, shell = _systemd_values(path.read_text()), _shell_values(path)
        assert systemd == shell, path.name
        assert len(systemd) >= 5, path.name
    for path, mode in ((example, "submit"), (readme, "")):  # and what the cron scripts accept
        load = f'. "$1/scripts/factory-env.sh"; load_factory_env {mode}'
        done = subprocess.run(["env", "-i", f"FACTORY_ENV_FILE={path}", "bash", "-c", load, "_",
                               str(REPO)], capture_output=True, text=True, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
    values = _systemd_values(example.read_text())
    assert values["FACTORY_PRODUCTION"] == "1"
    assert values["FACTORY_STORE_URL"] == "s3://factory/renders"
    assert values["FACTORY_DATABASE_URL"].startswith("postgresql")
    assert values["FACTORY_BROKER_URL"].startswith(("redis://", "rediss://"))


def test_the_env_file_has_one_path_everywhere() -> None:
    texts = {p: p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
                                        *sorted(SCRIPTS.iterdir()), *sorted(SYSTEMD.rglob("*"))]
             if p.is_file()}  # fmt: skip
    for path, text in texts.items():
        for other in re.findall(r"/etc/factory/[\w.-]*env\b", text):
            flower = other == "/etc/factory/flower.env" and "flower" in path.name + text
            assert other == ENV_FILE or flower, f"{path.relative_to(REPO)} names {other}"
    assert "\n" in _readme_env_block()
    for line in _readme_env_block().splitlines():  # one assignment a line, no comment after it
        assert line.count("=") <= 1 or line.startswith("FACTORY_DATABASE_URL"), line
        assert "#" not in line, line


def _cron_lines() -> list[tuple[str, str]]:
    """(user, command) of every entry in crontab.example, the commented examples too."""
    entries = []
    for line in (SCRIPTS / "crontab.example").read_text().splitlines():
        fields = line.lstrip("# ").split(None, 6)
        if len(fields) == 7 and all(re.fullmatch(r"[\d*/,-]+", f) for f in fields[:5]):
            entries.append((fields[5], fields[6]))
    return entries


def test_every_cron_line_loads_the_env_file_and_refuses_without_it(tmp_path: Path) -> None:
    entries = _cron_lines()
    assert len(entries) >= 3  # the nightly submission, the other nodes' preload, the CRL
    missing = tmp_path / "missing.env"
    for _, command in entries:
        program = command.split()[0]
        assert program.startswith("/opt/factory/scripts/"), command  # never factory directly
        script = SCRIPTS / program.removeprefix("/opt/factory/scripts/")
        assert script.is_file() and os.access(script, os.X_OK), command
        assert "factory-env.sh" in script.read_text(), f"{script.name} does not load the env file"
        args = command.split(">>")[0].split()[1:]
        env = {"FACTORY_ENV_FILE": str(missing), "FACTORY_HOME": str(tmp_path / "home")}
        done = _cron_run([str(script), *args], env, tmp_path)
        assert done.returncode != 0 and str(missing) in done.stderr, (command, done.stderr)
    assert not (tmp_path / "home" / "factory.db").exists()
    assert "renew-crl" in " ".join(c for _, c in entries)


# --- 2. the CRL renewed and the gateway reloaded, from cron ----------------------------------


def _make_certs(certs: Path, ca: Path, *args: str) -> None:
    done = subprocess.run(["bash", str(SCRIPTS / "make-certs"), "--ca-dir", str(ca),
                           "--out", str(certs), *args], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_disallowing_the_last_subject_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    """Issue 50, item 5: `disallow` of the only subject allowed exited 1 without a word and
    left a clients.map that refuses every client at the next reload."""
    ca, certs = tmp_path / "ca", tmp_path / "certs"
    for args in (("ca",), ("client", "one"), ("client", "two"), ("allow", "one")):
        _make_certs(certs, ca, *args)
    before = (certs / "clients.map").read_text()
    argv = ["bash", str(SCRIPTS / "make-certs"), "--ca-dir", str(ca), "--out", str(certs)]
    refused = subprocess.run([*argv, "disallow", "one"], capture_output=True, text=True)
    assert refused.returncode == 2, refused
    assert ("O=video factory,CN=one is the last subject clients.map admits: without it every "
            "client would be refused") in refused.stderr  # fmt: skip
    assert "allow --all" in refused.stderr
    assert (certs / "clients.map").read_text() == before
    _make_certs(certs, ca, "allow", "two")
    _make_certs(certs, ca, "disallow", "one")  # another is left: removed
    assert "CN=one" not in (certs / "clients.map").read_text()
    assert '"O=video factory,CN=two" 1;' in (certs / "clients.map").read_text()


def _gateway_pki(tmp_path: Path, pki: str, host: str) -> tuple[Path, Path]:
    """For a test that runs nginx (and fails at once without it): a CA with its keys in
    tmp_path/ca, and the gateway's server certificate for HOST, in tmp_path/PKI."""
    if shutil.which("nginx") is None:
        pytest.fail("nginx is not installed; `scripts/test` installs nginx-light", pytrace=False)
    ca, certs = tmp_path / "ca", tmp_path / pki
    _make_certs(certs, ca, "ca")
    _make_certs(certs, ca, "server", "gateway", "--host", host)
    return ca, certs


def _utc(seconds: int) -> str:
    at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds)
    return at.strftime("%Y%m%d%H%M%SZ")


def _next_update(crl: Path) -> datetime.datetime:
    """The earliest nextUpdate of the CRLs in crl.pem."""
    text = crl.read_text()
    found = []
    for block in re.findall(r"-----BEGIN X509 CRL-----.*?-----END X509 CRL-----", text, re.S):
        done = subprocess.run(["openssl", "crl", "-noout", "-nextupdate"], input=block,
                              capture_output=True, text=True, check=True)  # fmt: skip
        stamp = done.stdout.strip().split("=", 1)[1]
        found.append(datetime.datetime.strptime(stamp, "%b %d %H:%M:%S %Y %Z"))
    return min(found)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _gateway_conf(root: Path, certs: Path, port: int) -> Path:
    """docker/nginx-mtls.conf with this test's paths and port (tests/s3stand.py does the same)."""
    text = (REPO / "docker" / "nginx-mtls.conf").read_text()
    user = "\nuser root root;" if os.geteuid() == 0 else ""
    for old, new in {
        "pid /tmp/nginx-mtls.pid;": f"pid {root}/nginx.pid;",
        "error_log /dev/stderr info;": f"error_log {root}/error.log info;",
        "access_log /dev/stdout s3;": f"access_log {root}/access.log s3;",
        "/tmp/nginx-mtls-": f"{root}/nginx-",
        "server minio:9000;": f"server 127.0.0.1:{_free_port()};",  # nothing there: 502
        "listen 8443 ssl;": f"listen 127.0.0.1:{port} ssl;",
        "/etc/nginx/certs/": f"{certs}/",
        "include /etc/nginx/conf.d/*.conf;": "",
        "worker_processes auto;": f"worker_processes 1;{user}",
    }.items():
        text = text.replace(old, new)
    (root / "nginx.conf").write_text(text)
    return root / "nginx.conf"


def _client_status(port: int, certs: Path) -> tuple[int, str]:
    tls = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    tls.load_cert_chain(str(certs / "worker.pem"), str(certs / "worker.key"))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=tls, timeout=10)
    try:
        conn.request("HEAD", "/factory/renders/x")
        answer = conn.getresponse()
        return answer.status, answer.getheader("X-Client-Verify") or ""
    finally:
        conn.close()


def test_renew_crl_runs_from_cron_and_the_gateway_takes_the_new_crl(tmp_path: Path) -> None:
    ca, certs = _gateway_pki(tmp_path, "certs", "127.0.0.1")
    _make_certs(certs, ca, "client", "worker")
    _make_certs(certs, ca, "crl", "--start", _utc(-2 * 86400), "--end", _utc(-86400))  # expired
    port = _free_port()
    conf = _gateway_conf(tmp_path, certs, port)
    nginx = shutil.which("nginx")
    server = subprocess.Popen([nginx, "-e", str(tmp_path / "error.log"), "-c", str(conf),
                               "-g", "daemon off;"], stderr=subprocess.PIPE)  # fmt: skip
    try:
        wait_port(port, timeout=10, process=server)
        assert _client_status(port, certs) == (403, "FAILED:CRL has expired")
        env_file = _write_env(tmp_path / "factory.env", {
            "FACTORY_CA_DIR": str(ca), "FACTORY_PKI_DIR": str(certs),
            "FACTORY_GATEWAY_RELOAD": "nginx", "FACTORY_GATEWAY_CONF": str(conf)})  # fmt: skip
        done = _cron_run([str(SCRIPTS / "renew-crl")], {"FACTORY_ENV_FILE": str(env_file)},
                         tmp_path)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert _next_update(certs / "crl.pem") > datetime.datetime.now() + datetime.timedelta(
            days=40
        )
        deadline = time.monotonic() + 10  # the reload: new connections, the new CRL
        while (status := _client_status(port, certs))[0] == 403 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert status == (502, ""), status  # through the gateway; MinIO is not there
    finally:
        server.terminate()
        server.wait(10)


def test_renew_crl_reloads_the_compose_gateway_by_its_absolute_file(tmp_path: Path) -> None:
    ca, certs = tmp_path / "ca", tmp_path / "certs"
    _make_certs(certs, ca, "ca")
    before = _next_update(certs / "crl.pem")
    log = tmp_path / "docker.log"
    docker = tmp_path / "docker"  # the docker CLI, standing in: records what it was asked
    docker.write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    docker.chmod(0o755)
    settings = {"FACTORY_CA_DIR": str(ca), "FACTORY_PKI_DIR": str(certs),
                "FACTORY_DOCKER": str(docker)}  # fmt: skip
    env_file = _write_env(tmp_path / "factory.env", settings)
    time.sleep(1.1)  # a nextUpdate a second later at least
    done = _cron_run([str(SCRIPTS / "renew-crl")], {"FACTORY_ENV_FILE": str(env_file)}, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _next_update(certs / "crl.pem") > before
    compose = REPO / "docker" / "compose.yaml"
    assert log.read_text().splitlines() == [
        f"compose -f {compose} exec -T gateway nginx -t -q",
        f"compose -f {compose} exec -T gateway nginx -s reload",
    ]


def test_the_docs_renew_the_crl_with_the_script() -> None:
    for doc in ("README.md", "docs/deploy.md"):
        text = (REPO / doc).read_text()
        assert "scripts/renew-crl" in text, doc
        for line in text.splitlines():
            if re.match(r"\s*`?[\d*]+ [\d*]+ [\d*]+ [\d*]+ [\d*]+ ", line.strip("- ")):
                assert "/opt/factory/scripts/" in line, f"{doc}: a cron line with a relative path"
            assert not re.search(r"make-certs \$PKI crl &&", line), f"{doc}: {line}"


# --- 3. one bucket and prefix ----------------------------------------------------------------

STORE = "s3://factory/renders"
S3_URL = re.compile(r"s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/[^\s`'\",)\]}]*)?")
URL_DOCS = ["README.md", "docs/deploy.md", "docs/storage.md", "docs/operations.md",
            "docs/configuration.md"]  # fmt: skip
PLACEHOLDERS = {"bucket"}  # s3://bucket/prefix


def _granted(policy: dict, action: str, resource: str) -> bool:
    return any(
        statement["Effect"] == "Allow"
        and action in statement["Action"]
        and any(fnmatch.fnmatchcase(resource, pattern) for pattern in statement["Resource"])
        for statement in policy["Statement"]
    )


def test_one_bucket_and_prefix_in_readme_compose_kubernetes_and_the_minio_policy() -> None:
    compose = yaml.safe_load((REPO / "docker" / "compose.yaml").read_text())
    k8s = [d for d in yaml.safe_load_all((REPO / "docker" / "k8s" / "config.yaml").read_text())]
    readme = (REPO / "README.md").read_text()
    stores = {
        "compose": compose["x-app"]["environment"]["FACTORY_STORE_URL"],
        "kubernetes": next(d for d in k8s if d["metadata"]["name"] == "factory-config")["data"][
            "FACTORY_STORE_URL"
        ],
        "README": re.search(r"^FACTORY_STORE_URL=(\S+)$", readme, re.M).group(1),
        "env example": re.search(
            r"^FACTORY_STORE_URL=(\S+)$", (SYSTEMD / "factory.env.example").read_text(), re.M
        ).group(1),
    }
    assert set(stores.values()) == {STORE}, stores
    policy = json.loads((REPO / "docker" / "minio" / "factory-policy.json").read_text())
    setup = (REPO / "docker" / "minio" / "setup.sh").read_text()
    assert re.search(r"\bBUCKET=factory\b", setup)
    urls = [(doc, m.group(1), (m.group(2) or "/").lstrip("/"))
            for doc in URL_DOCS for m in S3_URL.finditer((REPO / doc).read_text())]  # fmt: skip
    urls += [("store", "factory", "renders")]
    for doc, bucket, key in urls:
        if bucket in PLACEHOLDERS:
            continue
        where = f"{doc}: s3://{bucket}/{key}"
        assert _granted(policy, "s3:ListBucket", f"arn:aws:s3:::{bucket}"), where
        for action in ("s3:GetObject", "s3:PutObject", "s3:DeleteObject"):
            assert _granted(policy, action, f"arn:aws:s3:::{bucket}/{key or 'x'}/x"), where
    assert len(urls) >= 3


# --- 6. systemd units for every service, and a gateway for bare metal ------------------------

UNITS = {  # the unit, and what it runs (docs/operations.md, "Services")
    "factory-gpu-worker@.service": ["worker", "--gpu"],
    "factory-cpu-worker.service": ["worker", "--cpu"],
    "factory-beat.service": ["beat"],
    "factory-flower.service": ["flower"],
    "factory-console.service": ["serve"],
    "factory-gateway.service": [],
}
FACTORY = "/opt/factory/.venv/bin/factory"


def _unit(name: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in (SYSTEMD / name).read_text().splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).append(value.strip())
    return found


@pytest.fixture(scope="module")
def systemd_root(tmp_path_factory) -> Path:
    """A root for `systemd-analyze verify --root`: systemd's own units, the units under test in
    /etc/systemd/system, and the programs they start (stand-ins: verify checks that they exist
    and may be executed)."""
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is missing; `scripts/test` installs systemd", pytrace=False)
    root = tmp_path_factory.mktemp("systemd-root")
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    (root / "etc/systemd/system").mkdir(parents=True)
    for unit in SYSTEMD.glob("*.service"):
        shutil.copy(unit, root / "etc/systemd/system" / unit.name)
    programs = {FACTORY, "/usr/sbin/nginx"}
    for name in UNITS:
        for line in _unit(name).get("ExecStart", []) + _unit(name).get("ExecReload", []):
            programs.add(line.lstrip("-@+!").split()[0])
    for program in programs:
        path = root / program.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    return root


def _verify(root: Path, *units: str) -> subprocess.CompletedProcess:
    return subprocess.run(["systemd-analyze", "verify", "--man=no", f"--root={root}", *units],
                          capture_output=True, text=True, check=False)  # fmt: skip


def test_every_service_has_a_unit_that_systemd_accepts(systemd_root: Path) -> None:
    assert {p.name for p in SYSTEMD.glob("*.service")} == set(UNITS)
    instances = [n.replace("@.", "@0.") for n in UNITS] + ["factory-gpu-worker@7.service"]
    done = _verify(systemd_root, *instances)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    for name, runs in UNITS.items():
        unit = _unit(name)
        [start] = unit["ExecStart"]
        if runs:  # the factory's own: the one env file, its own user
            assert unit["EnvironmentFile"][0] == ENV_FILE, name
            assert start.split()[0] == FACTORY, name
            assert start.split()[1 : 1 + len(runs)] == runs, name
            assert unit["User"] == ["factory"], name
        assert unit["Restart"] == ["always"], name
        assert unit["WantedBy"] == ["multi-user.target"], name
    gpu = _unit("factory-gpu-worker@.service")
    assert "--gpu %i" in gpu["ExecStart"][0] and gpu["KillMode"] == ["mixed"]
    assert int(gpu["TimeoutStopSec"][0]) >= 1800  # a segment may finish


def test_the_unit_check_does_catch_mistakes(systemd_root: Path, tmp_path: Path) -> None:
    units = systemd_root / "etc/systemd/system"
    good = (units / "factory-beat.service").read_text()
    try:
        (units / "factory-beat.service").write_text(good.replace("Restart=", "Restrat="))
        assert "Unknown key" in _verify(systemd_root, "factory-beat.service").stderr
        (units / "factory-beat.service").write_text(good.replace(FACTORY, "/opt/nowhere/factory"))
        done = _verify(systemd_root, "factory-beat.service")
        assert done.returncode != 0 and "/opt/nowhere/factory" in done.stderr
    finally:
        (units / "factory-beat.service").write_text(good)


def test_the_units_flags_are_the_clis(tmp_path: Path) -> None:
    factory = REPO / ".venv" / "bin" / "factory"
    for name, runs in UNITS.items():
        if not runs:
            continue
        argv = _unit(name)["ExecStart"][0].split()[1:]
        done = subprocess.run([str(factory), runs[0], "--help"], capture_output=True, text=True,
                              env={**os.environ, "COLUMNS": "200"}, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        for flag in (a for a in argv if a.startswith("--")):
            assert flag in done.stdout, f"{name}: {flag} is not an option of {runs[0]}"


def test_crontab_says_what_is_true_the_services_run_as_units() -> None:
    text = (SCRIPTS / "crontab.example").read_text()
    assert "docker/systemd" in text
    deploy = (REPO / "docs" / "deploy.md").read_text()
    for name in UNITS:
        assert name in deploy, f"docs/deploy.md does not name {name}"
    assert "docker/systemd/gateway/nginx.conf" in deploy


GATEWAY = SYSTEMD / "gateway"
JOURNAL_SYSLOG = "syslog:server=unix:/dev/log,tag=factory_gateway,nohostname"
# What bare metal changes in the compose gateway's files, and nothing else: the same checks.
BARE_METAL = {
    "nginx.conf": {
        "pid /tmp/nginx-mtls.pid;": "pid /run/factory-gateway.pid;",
        # the journal: stderr as given (not opened by path), requests by syslog
        "error_log /dev/stderr info;": "error_log stderr info;",
        "access_log /dev/stdout s3;": f"access_log {JOURNAL_SYSLOG} s3;",
        "server minio:9000;": "server 127.0.0.1:9000;",
        "/etc/nginx/certs/": "/etc/factory/pki/",
        "include /etc/nginx/conf.d/*.conf;": "include /etc/factory/gateway/conf.d/*.conf;",
    },
    "conf.d/flower.conf": {
        "listen 5556 ssl;": "listen 127.0.0.1:5556 ssl;",
        "    resolver 127.0.0.11 valid=30s ipv6=off;\n": "",
        "http://flower:5555": "http://127.0.0.1:5555",
        "/etc/nginx/certs/": "/etc/factory/pki/",
    },
    "conf.d/console.conf": {
        "    resolver 127.0.0.11 valid=30s ipv6=off;\n": "",
        "http://console-upstream:8080": "http://127.0.0.1:8080",
        "/etc/nginx/certs/": "/etc/factory/pki/",
    },
}


def _code(text: str) -> str:
    """nginx directives without comments and blank lines (the comments say where they run)."""
    lines = (re.sub(r"\s*#.*", "", line).rstrip() for line in text.splitlines())
    return "\n".join(line for line in lines if line.strip())


def test_the_bare_metal_gateway_is_the_compose_gateway_at_local_addresses() -> None:
    compose = {"nginx.conf": REPO / "docker" / "nginx-mtls.conf",
               "conf.d/flower.conf": REPO / "docker" / "nginx.d" / "flower.conf",
               "conf.d/console.conf": REPO / "docker" / "nginx.d" / "console.conf"}  # fmt: skip
    assert {p.relative_to(GATEWAY).as_posix() for p in GATEWAY.rglob("*.conf")} == set(compose)
    for name, swaps in BARE_METAL.items():
        expected = compose[name].read_text()
        for old, new in swaps.items():
            assert old in expected, (name, old)
            expected = expected.replace(old, new)
        bare = (GATEWAY / name).read_text()
        assert _code(bare) == _code(expected), name
        for docker_only in ("127.0.0.11", "minio:", "flower:", "console-upstream", "/etc/nginx/"):
            assert docker_only not in _code(bare), (name, docker_only)
    # The upstreams are where the units listen.
    console = _unit("factory-console.service")["ExecStart"][0]
    assert "--host 127.0.0.1 --port 8080" in console
    flower = _unit("factory-flower.service")["ExecStart"][0]
    assert "--address 127.0.0.1 --port 5555" in flower
    trusted = " ".join(_unit("factory-console.service")["Environment"])
    assert "FACTORY_CONSOLE_TRUSTED_PROXIES=127.0.0.1" in trusted
    assert "FACTORY_CONSOLE_SECURE_COOKIES=always" in trusted
    gateway = _unit("factory-gateway.service")
    assert "-c /etc/factory/gateway/nginx.conf" in gateway["ExecStart"][0]
    assert "-s reload" in gateway["ExecReload"][-1] and "-t" in gateway["ExecReload"][0]


def test_the_bare_metal_gateway_config_passes_nginx_t(tmp_path: Path) -> None:
    _, certs = _gateway_pki(tmp_path, "pki", "localhost")
    user = "\nuser root root;" if os.geteuid() == 0 else ""
    swaps = {
        "/etc/factory/pki/": f"{certs}/",
        "/etc/factory/gateway/conf.d/": f"{tmp_path}/conf.d/",
        "pid /run/factory-gateway.pid;": f"pid {tmp_path}/nginx.pid;",
        "/tmp/nginx-mtls-": f"{tmp_path}/nginx-",
        "worker_processes auto;": f"worker_processes 1;{user}",
    }
    (tmp_path / "conf.d").mkdir()
    for name in BARE_METAL:
        text = (GATEWAY / name).read_text()
        for old, new in swaps.items():
            text = text.replace(old, new)
        (tmp_path / name).write_text(text)
    nginx = ["nginx", "-t", "-p", str(tmp_path), "-e", str(tmp_path / "error.log"),
             "-c", str(tmp_path / "nginx.conf")]  # fmt: skip
    # Under systemd, stdout and stderr are a socket to the journal, which cannot be opened by
    # path: nginx -t opens every log the configuration names (issue 50, item 3: the gateway
    # logged to /dev/stderr and /dev/stdout, and its unit could not start).
    journal, ours = socket.socketpair()
    with journal, ours:
        done = subprocess.run(nginx, stdout=journal, stderr=journal, check=False, timeout=60)
        journal.close()
        said = b"".join(iter(lambda: ours.recv(65536), b"")).decode(errors="replace")
    assert done.returncode == 0, said
    assert "test is successful" in said
