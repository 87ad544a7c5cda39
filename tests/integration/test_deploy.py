"""The deployment files, checked offline: no Docker engine runs here, so the compose file is
parsed and resolved by docker-compose itself, the Kubernetes manifests are validated against
the API schemas (kubernetes-validate) and checked for what the factory needs of them, and for
the deployment boundaries (docs/deploy.md): which container gets which key, which service may
reach which, who runs as whom. The gateway's console blocks are also run, under Debian's nginx
in front of a stand-in console."""

from __future__ import annotations

import http.client
import http.server
import ipaddress
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import threading
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from factory.config.console import parse as parse_console_settings
from tests.conftest import REPO
from tests.s3stand import wait_port

DOCKER = REPO / "docker"
K8S = DOCKER / "k8s"
SECRET_NAME = re.compile(r"SECRET|PASSWORD|TOKEN|_KEY$|BASIC_AUTH")
# A full version: 1.27.3, 3.11.10-slim-bookworm, MinIO's RELEASE.2024-11-07T00-52-20Z; two
# parts where that is the whole version (PostgreSQL 16.4). Not latest, not 7, not 1.27.
PINNED_TAG = re.compile(r"(\d+\.){2}\d+\b[\w.-]*|RELEASE\.\d{4}-\d\d-\d\dT\d\d-\d\d-\d\dZ")
TWO_PART_VERSIONS = re.compile(r"postgres:\d+\.\d+(-[\w.-]+)?")
OWN_IMAGES = ("video-factory:", "registry.example.com/video-factory:")  # built by this repo
APPS = {"migrate", "beat", "flower", "console", "cpu-worker", "gpu-worker-0", "gpu-worker-1"}
CLIENT_PAIR = {"beat": "beat", "console": "console", "cpu-worker": "worker",
               "gpu-worker-0": "worker", "gpu-worker-1": "worker"}  # fmt: skip
GATEWAY_FILES = {"gateway.pem", "gateway.key", "ca.pem", "crl.pem", "clients.map"}
CA_KEYS = {"ca.key", "intermediate.key"}


def _copy_docker(source: str, names: list[str]) -> set[str]:
    """Leave out what an operator's checkout may hold: keys, and real env/password files."""
    if Path(source).name == "pki":
        return set(names)
    if Path(source).name in ("env", "docker"):
        return {n for n in names if n.endswith(".env") or n.endswith("-password")}
    return set()


@pytest.fixture(scope="module")
def compose_dir(tmp_path_factory) -> Path:
    """docker/ in a temporary folder, every *.example copied to its real name."""
    root = tmp_path_factory.mktemp("deploy")
    shutil.copytree(DOCKER, root / "docker", ignore=_copy_docker)
    for example in (root / "docker").rglob("*.example"):
        shutil.copy(example, example.with_suffix(""))
    return root / "docker"


@pytest.fixture(scope="module")
def compose(compose_dir: Path) -> dict:
    """docker-compose's own resolution of docker/compose.yaml (anchors, env files, defaults)."""
    if shutil.which("docker-compose") is None:
        pytest.fail("docker-compose is not installed; `scripts/test` installs it", pytrace=False)
    done = subprocess.run(
        ["docker-compose", "-f", str(compose_dir / "compose.yaml"), "config"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


def _mounts(service: dict) -> list[tuple[str, str, str]]:
    """(source, target, mode) of each volume as docker-compose resolves them."""
    found = []
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            found.append(
                (volume["source"], volume["target"], "ro" if volume.get("read_only") else "rw")
            )
        else:
            parts = volume.split(":")
            found.append((parts[0], parts[1], parts[2] if len(parts) > 2 else "rw"))
    return found


def _ports(service: dict) -> list[tuple[str, str, str]]:
    """(host address, published, target) of each published port, resolved."""
    found = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            found.append((port.get("host_ip", ""), str(port["published"]), str(port["target"])))
        else:
            *host, published, target = str(port).split("/")[0].split(":")
            found.append((host[0] if host else "", published, target))
    return found


def _text(value: object) -> str:
    return " ".join(value) if isinstance(value, list) else str(value or "")


def test_compose_has_the_whole_factory_wired_as_the_design_says(compose: dict) -> None:
    services = compose["services"]
    assert {"postgres", "redis", "minio", "minio-setup", "gateway"} | APPS <= set(services)
    redis_command = " ".join(services["redis"]["command"])
    assert "--maxmemory-policy noeviction" in redis_command
    assert "--appendonly yes" in redis_command
    gateway_mounts = " ".join(":".join(m) for m in _mounts(services["gateway"]))
    assert "nginx-mtls.conf" in gateway_mounts and "/etc/nginx/nginx.conf" in gateway_mounts
    assert services["migrate"]["command"] == ["db", "upgrade"]
    for name in APPS - {"migrate"}:
        needs = services[name]["depends_on"]
        assert needs["migrate"]["condition"] == "service_completed_successfully", name
    for name in CLIENT_PAIR:  # the bucket, the user and the gateway exist before they start
        assert "gateway" in services[name]["depends_on"], name
    assert services["gateway"]["depends_on"]["minio-setup"]["condition"] == (
        "service_completed_successfully"
    )
    seen = set()
    for name in ("gpu-worker-0", "gpu-worker-1"):
        [device] = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["capabilities"] == ["gpu"] and device["driver"] == "nvidia"
        assert device["device_ids"] == [name[-1]]
        # The container sees its one card as GPU 0 (--gpu N is the process's view).
        assert services[name]["command"][:3] == ["worker", "--gpu", "0"]
        seen |= set(device["device_ids"])
    assert seen == {"0", "1"}  # one worker per GPU, none shared
    for name in ("cpu-worker", "gpu-worker-0", "gpu-worker-1"):
        assert "--health-port" in services[name]["command"]
    for name in APPS:  # the image's uid, a read-only root, no capabilities
        assert services[name]["user"] == "10001:10001", name
        assert services[name]["read_only"] is True, name
        assert services[name]["cap_drop"] == ["ALL"], name


def test_compose_bakes_in_no_secret() -> None:
    text = (DOCKER / "compose.yaml").read_text()
    for line in text.splitlines():
        key = line.strip().split(":", 1)[0]
        path = key.startswith("FACTORY_S3_") or key.endswith("_FILE")  # those are paths
        if SECRET_NAME.search(key) and not path:
            pytest.fail(f"compose.yaml sets {key} itself; secrets belong in docker/env/")
    raw = yaml.safe_load(text)
    for name, service in raw["services"].items():
        files = service.get("env_file", []) if isinstance(service, dict) else []
        for env_file in [files] if isinstance(files, str) else files:
            assert (DOCKER / f"{env_file}.example").is_file(), f"{name}: no {env_file}.example"
    for secret in raw["secrets"].values():
        assert (DOCKER / f"{secret['file']}.example").is_file(), secret
    assert not (DOCKER / "factory.env.example").exists()  # one file for all: replaced
    ignored = (REPO / ".gitignore").read_text().splitlines()
    assert {"docker/env/*", "!docker/env/*.example", "docker/pki/"} <= set(ignored)


def test_no_container_gets_the_ca_key_or_a_folder_of_keys(compose: dict) -> None:
    services = compose["services"]
    folders = set()
    for name, service in services.items():
        got = set()
        for source, target, mode in _mounts(service):
            path = Path(source)
            if "pki" in path.parts:  # one file each, never the folder
                assert path.parent.name == "pki" and path.suffix, f"{name}: mounts {source}"
                assert path.name not in CA_KEYS, f"{name} gets the CA's key"
                assert mode == "ro", f"{name}: {target} is writable"
                folders.add(path.parent)
                got.add(path.name)
        if name in CLIENT_PAIR:
            own = CLIENT_PAIR[name]
            assert got == {"ca.pem", f"{own}.pem", f"{own}.key"}, name
        elif name == "gateway":
            assert got == GATEWAY_FILES
        else:
            assert not got, f"{name} needs no certificate: {got}"
    assert folders
    for name, service in services.items():  # nor a folder holding docker/pki (.., ./, docker/)
        for source, _, _ in _mounts(service):
            for pki in folders:
                assert not pki.is_relative_to(Path(source)), f"{name} mounts {source}"


def test_the_deploy_steps_keep_the_ca_outside_docker() -> None:
    steps = (REPO / "docs" / "deploy.md").read_text()
    made = [line for line in steps.splitlines() if "scripts/make-certs" in line]
    assert made
    for line in made:
        ca_dir = re.search(r"--ca-dir\s+(\S+)", line)
        assert ca_dir, f"make-certs without --ca-dir: {line}"
        assert not ca_dir.group(1).lstrip("./").startswith("docker"), line
    for key in CA_KEYS:
        assert not re.search(rf"--from-file=\S*{re.escape(key)}", steps), key


def test_postgres_and_redis_authenticate(compose: dict, compose_dir: Path) -> None:
    services = compose["services"]
    for path in [DOCKER / "compose.yaml", *K8S.glob("*.yaml")]:
        assert not re.search(r"\btrust\b", path.read_text()), f"{path.name}: trust auth"
    postgres = services["postgres"]
    assert "POSTGRES_HOST_AUTH_METHOD" not in postgres["environment"]
    assert "POSTGRES_PASSWORD" not in postgres["environment"]
    secret = postgres["environment"]["POSTGRES_PASSWORD_FILE"].removeprefix("/run/secrets/")
    assert secret in [s["source"] for s in postgres["secrets"]]
    assert compose["secrets"][secret]["file"]
    redis = services["redis"]
    setup = _text(redis.get("entrypoint")) + " " + _text(redis.get("command"))
    assert "requirepass" in setup or "aclfile" in setup
    assert "redis-password" in [s["source"] for s in redis["secrets"]]
    password = (compose_dir / "env" / "redis-password").read_text().strip()
    assert password
    for name, service in services.items():  # ps shows every command line to the whole host
        for field in ("entrypoint", "command"):
            assert password not in _text(service.get(field)), f"{name}: password in its {field}"
        assert "--requirepass" not in _text(service.get("command")), name
    assert "redis-cli" in _text(redis["healthcheck"]["test"])
    raw = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    for name in APPS:
        env = services[name]["environment"]
        assert re.match(r"postgresql\+psycopg2://factory:[^@/]+@", env["FACTORY_DATABASE_URL"])
        for url in ("FACTORY_BROKER_URL", "FACTORY_REDIS_URL"):
            assert re.match(r"rediss?://[^@/]*:[^@/]+@", env[url]), f"{name}: {url}"
    assert "FACTORY_DATABASE_URL" not in json.dumps(raw)  # from env/app.env, not compose.yaml


def test_minio_root_credentials_stay_with_minio_and_its_setup(compose: dict) -> None:
    services = compose["services"]
    for name, service in services.items():
        roots = [key for key in service.get("environment", {}) if key.startswith("MINIO_ROOT")]
        assert not roots or name in ("minio", "minio-setup"), f"{name} gets {roots}"
    storage = set(services["minio"]["networks"])
    for name, service in services.items():
        if storage & set(service.get("networks", {})):
            assert name in ("minio", "minio-setup", "gateway"), f"{name} can reach MinIO"
    assert {"minio", "minio-setup"} & APPS == set()
    assert not services["minio"].get("ports")  # the console neither
    root_user = services["minio"]["environment"]["MINIO_ROOT_USER"]
    for name in CLIENT_PAIR:
        assert services[name]["environment"]["AWS_ACCESS_KEY_ID"] != root_user, name
    policy = json.loads((DOCKER / "minio" / "factory-policy.json").read_text())
    actions = set()
    for statement in policy["Statement"]:
        assert statement["Effect"] == "Allow"
        assert set(statement["Resource"]) <= {"arn:aws:s3:::factory", "arn:aws:s3:::factory/*"}
        actions |= set(statement["Action"])
    assert {"s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:ListBucket",
            "s3:AbortMultipartUpload"} <= actions  # fmt: skip
    assert not [a for a in actions if "*" in a or a.startswith("admin:")]
    script = (DOCKER / "minio" / "setup.sh").read_text()
    assert "factory-policy.json" in script and "policy attach" in script


def test_flower_is_reached_only_through_the_gateway(compose: dict) -> None:
    services = compose["services"]
    flower = services["flower"]
    assert not flower.get("ports")
    assert "--basic-auth" not in _text(flower["command"])
    assert flower["environment"]["FACTORY_FLOWER_BASIC_AUTH"]
    for name, service in services.items():
        if name != "flower":
            assert "FACTORY_FLOWER_BASIC_AUTH" not in service.get("environment", {}), name
        if name != "gateway":
            assert not service.get("ports"), f"{name} publishes a port"
    gateway = services["gateway"]
    flower_ports = [p for p in _ports(gateway) if p[2] == "5556"]
    assert flower_ports and all(host == "127.0.0.1" for host, _, _ in flower_ports)
    conf_d = [m for m in _mounts(gateway) if m[1] == "/etc/nginx/conf.d"]
    assert conf_d and Path(conf_d[0][0]).name == "nginx.d" and conf_d[0][2] == "ro"
    assert "include /etc/nginx/conf.d/*.conf;" in (DOCKER / "nginx-mtls.conf").read_text()
    _assert_flower_block((DOCKER / "nginx.d" / "flower.conf").read_text(), "http://flower:5555")


def _assert_flower_block(conf: str, upstream: str) -> None:
    for line in ("listen 5556 ssl;", "ssl_verify_client on;",
                 "ssl_certificate /etc/nginx/certs/gateway.pem;",
                 "ssl_client_certificate /etc/nginx/certs/ca.pem;",
                 "ssl_crl /etc/nginx/certs/crl.pem;",
                 "proxy_set_header Upgrade $http_upgrade;"):  # fmt: skip
        assert line in conf, line
    assert upstream in conf


def _image_is_pinned(image: str) -> bool:
    name, _, tag = image.rpartition(":")
    if not name or "/" in tag or tag == "latest":
        return False
    return bool(PINNED_TAG.fullmatch(tag) or TWO_PART_VERSIONS.fullmatch(image))


def test_every_image_is_pinned_to_a_version(compose: dict) -> None:
    for floating in ("redis:7", "nginx:1.27", "minio/minio:latest", "python:3.11-slim", "redis"):
        assert not _image_is_pinned(floating), floating
    assert _image_is_pinned("nginx:1.27.3") and _image_is_pinned("postgres:16.4")
    for name, service in compose["services"].items():
        if not service["image"].startswith(OWN_IMAGES):
            assert _image_is_pinned(service["image"]), f"{name}: {service['image']}"
    for file, doc in manifests():
        for pod in _pods(doc):
            for container in pod["containers"]:
                image = container["image"]
                assert image.startswith(OWN_IMAGES) or _image_is_pinned(image), (file, image)
    for dockerfile in ("Dockerfile", "Dockerfile.gpu"):
        text = (DOCKER / dockerfile).read_text()
        args = dict(re.findall(r"^ARG (\w+)=(\S+)", text, re.M))
        stages = set(re.findall(r"^FROM \S+ AS (\S+)", text, re.M))
        for base in re.findall(r"^FROM (\S+)", text, re.M):
            for arg, default in args.items():
                base = base.replace(f"${{{arg}}}", default)
            assert base in stages or _image_is_pinned(base), f"{dockerfile}: FROM {base}"
        assert "USER 10001:10001" in text and "--uid 10001" in text, dockerfile


def _dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rules, closely enough: patterns are anchored at the context's
    root, ** spans folders, a match on a folder covers what it holds, the last match wins."""
    ignored = False
    parts = path.split("/")
    for pattern in patterns:
        negated = pattern.startswith("!")
        glob = pattern.removeprefix("!").strip("/")
        regex = ""
        for token in re.split(r"(\*\*/|\*\*|\*|\?)", glob):
            regex += {"**/": "(.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(
                token, re.escape(token)
            )
        if any(re.fullmatch(regex, "/".join(parts[:n])) for n in range(1, len(parts) + 1)):
            ignored = not negated
    return ignored


def test_dockerignore_keeps_keys_env_files_and_state_out_of_the_build_context() -> None:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    patterns = [s for s in (line.strip() for line in lines) if s and not s.startswith("#")]
    assert _dockerignored("a/b.key", ["**/*.key"]) and not _dockerignored("a/b.key", ["*.key"])
    for secret in ("docker/pki/ca.key", "docker/pki/intermediate.key", "docker/pki/worker.key",
                   "docker/pki/ca.pem", "docker/pki/crl.pem", "certs/ca.key", "ca.key",
                   "somewhere/deep/gateway.key", "factory/leaked.pem", "revoked.crl",
                   "docker/env/app.env", "docker/env/redis-password", "docker/factory.env",
                   "docker/env/postgres-password", ".env", ".venv/bin/python", ".git/config",
                   ".factory/factory.db", "tests/data/footage/cityCC0.mpg",
                   "factory/__pycache__/config.cpython-311.pyc", ".pytest_cache/v/x"):  # fmt: skip
        assert _dockerignored(secret, patterns), f"{secret} would enter the build context"
    copied = []
    for dockerfile in ("Dockerfile", "Dockerfile.gpu"):
        for line in (DOCKER / dockerfile).read_text().splitlines():
            if line.startswith("COPY") and "--from" not in line:
                copied += line.split()[1:-1]
    for source in copied:  # everything the images need is still sent
        files = [REPO / source] if (REPO / source).is_file() else (REPO / source).rglob("*")
        for file in files:
            relative = file.relative_to(REPO).as_posix()
            if file.is_file() and "__pycache__" not in relative:
                assert not _dockerignored(relative, patterns), f"{relative} is left out"


def manifests() -> list[tuple[str, dict]]:
    found = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") != "Kustomization":
                found.append((path.name, doc))
    return found


def _pods(doc: dict) -> list[dict]:
    if doc["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
        return [doc["spec"]["template"]["spec"]]
    return []


@pytest.mark.parametrize(
    ("name", "doc"), manifests(), ids=lambda v: v if isinstance(v, str) else v["kind"]
)
def test_every_manifest_matches_the_kubernetes_schema(name: str, doc: dict) -> None:
    kubernetes_validate.validate(doc, "1.30", strict=True)


def test_the_schema_check_does_catch_mistakes() -> None:
    _, deployment = next(m for m in manifests() if m[1]["kind"] == "Deployment")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.30", strict=True)


def test_rollouts_keep_capacity_probes_gpus_and_secrets() -> None:
    docs = dict(((n, d["kind"]), d) for n, d in manifests())
    listed = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    assert set(listed) | {"migrate-job.yaml"} == {p.name for p in K8S.glob("*.yaml")} - {
        "kustomization.yaml"
    }
    for (name, kind), doc in docs.items():
        if kind != "Deployment":
            continue
        pod = doc["spec"]["template"]["spec"]
        if doc["metadata"]["name"] != "beat":  # the single sweeper is replaced, not doubled
            assert doc["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0, name
        for container in pod["containers"]:
            assert "livenessProbe" in container, name
            for variable in container.get("env", []):
                assert not (SECRET_NAME.search(variable["name"]) and "value" in variable), name
        for volume in pod.get("volumes", []):
            if volume["name"] in ("pki", "tls"):
                assert "secret" in volume, name  # key material is mounted from a Secret
    for worker in ("gpu-worker.yaml", "cpu-worker.yaml"):
        [container] = docs[(worker, "Deployment")]["spec"]["template"]["spec"]["containers"]
        assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert {"secretRef": {"name": "factory-secrets"}} in container["envFrom"]
    [gpu] = docs[("gpu-worker.yaml", "Deployment")]["spec"]["template"]["spec"]["containers"]
    assert gpu["resources"]["requests"]["nvidia.com/gpu"] == 1
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == 1
    for _, doc in manifests():
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"].startswith("factory-"):
            data = doc["data"]
            assert not [key for key in data if SECRET_NAME.search(key) and "FACTORY_S3" not in key]
            for url in ("FACTORY_DATABASE_URL", "FACTORY_BROKER_URL", "FACTORY_REDIS_URL"):
                assert url not in data, f"{url} carries a password: it belongs in the Secret"
    steps = (REPO / "docs" / "deploy.md").read_text()
    factory_secrets = steps[steps.index("create secret generic factory-secrets") :]
    factory_secrets = factory_secrets[: factory_secrets.index("\nkubectl")]
    for url in ("FACTORY_DATABASE_URL", "FACTORY_BROKER_URL", "FACTORY_REDIS_URL"):
        assert url in factory_secrets, url
    assert "FLOWER" not in factory_secrets  # Flower's basic auth is for Flower only


def test_every_pod_runs_unprivileged_on_a_read_only_root() -> None:
    pods = [(name, pod) for name, doc in manifests() for pod in _pods(doc)]
    assert len(pods) >= 6
    for name, pod in pods:
        assert pod["automountServiceAccountToken"] is False, name
        context = pod["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] == 10001, name
        assert context["fsGroup"] == 10001, name  # the secret files' group
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}, name
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for volume in volumes.values():
            if "secret" in volume:
                assert volume["secret"]["defaultMode"] == 0o440, (name, volume["name"])
        for container in pod.get("initContainers", []) + pod["containers"]:
            own = container["securityContext"]
            assert own["runAsNonRoot"] is True and own["runAsUser"] == 10001, name
            assert own["allowPrivilegeEscalation"] is False, name
            assert own["readOnlyRootFilesystem"] is True, name
            assert own["capabilities"] == {"drop": ["ALL"]}, name
            assert own["seccompProfile"] == {"type": "RuntimeDefault"}, name
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            assert "emptyDir" in volumes[mounts["/tmp"]], f"{name}: no writable /tmp"


def _selects(policy: dict, labels: dict) -> bool:
    wanted = policy["spec"]["podSelector"].get("matchLabels", {})
    return bool(wanted) and wanted.items() <= labels.items()


def test_network_policies_deny_by_default_and_open_only_the_factory_paths() -> None:
    policies = [doc for _, doc in manifests() if doc["kind"] == "NetworkPolicy"]
    assert any(
        p["spec"]["podSelector"] == {} and p["spec"]["policyTypes"] == ["Ingress"]
        and not p["spec"].get("ingress") for p in policies
    ), "no default deny for ingress"  # fmt: skip
    pods = {doc["metadata"]["name"]: pod_doc["metadata"]["labels"]
            for _, doc in manifests() if _pods(doc)
            for pod_doc in [doc["spec"]["template"]]}  # fmt: skip
    factory = {"tier": "app"}
    for name in ("beat", "flower", "console", "cpu-worker", "gpu-worker", "factory-migrate"):
        assert factory.items() <= pods[name].items(), f"{name} is not a factory pod"
    assert not factory.items() <= pods["gateway"].items()
    gateway = {"app": "gateway"}
    charts = {name: {"app.kubernetes.io/name": name} for name in ("redis", "postgresql", "minio")}
    allowed = {  # each service's pods, who must reach them, who else may (its own replicas)
        "redis": (charts["redis"], factory, [charts["redis"]]),
        "postgres": (charts["postgresql"], factory, [charts["postgresql"]]),
        "minio": (charts["minio"], gateway, [charts["minio"]]),
        "flower": (pods["flower"], gateway, []),
        "console": (pods["console"], gateway, []),
        "gateway": (pods["gateway"], factory, []),
    }
    for service, (labels, needed, also) in allowed.items():
        covering = [p for p in policies if _selects(p, labels)]
        assert covering, f"no NetworkPolicy for {service}"
        admitted = []
        for policy in covering:
            for rule in policy["spec"]["ingress"]:
                for peer in rule["from"]:
                    assert set(peer) == {"podSelector"}, f"{service}: {peer}"
                    admitted.append(peer["podSelector"]["matchLabels"])
        assert needed in admitted, service
        assert all(peer in [needed, *also] for peer in admitted), f"{service}: {admitted}"
    health = [p for p in policies if any(r.get("ports") == [{"port": 9100, "protocol": "TCP"}]
                                         for r in p["spec"].get("ingress", []))]  # fmt: skip
    assert health, "no policy for the workers' health port"
    for rule in health[0]["spec"]["ingress"]:
        for peer in rule["from"]:
            assert "kubernetes.io/metadata.name" in peer["namespaceSelector"]["matchLabels"]


def test_kubernetes_flower_sits_behind_the_gateway_with_its_own_secret() -> None:
    docs = dict(((n, d["kind"], d["metadata"]["name"]), d) for n, d in manifests())
    flower = docs[("flower.yaml", "Deployment", "flower")]["spec"]["template"]["spec"]
    [container] = flower["containers"]
    assert "--basic-auth" not in container["args"]
    assert {"secretRef": {"name": "factory-flower"}} in container["envFrom"]
    assert {"secretRef": {"name": "factory-secrets"}} not in container["envFrom"]
    for (_, _, name), doc in docs.items():
        for pod in _pods(doc):
            if name != "flower":
                assert "factory-flower" not in json.dumps(pod), name
    gateway = docs[("gateway.yaml", "Deployment", "gateway")]["spec"]["template"]["spec"]
    [nginx] = gateway["containers"]
    mounts = {m["mountPath"]: m["name"] for m in nginx["volumeMounts"]}
    volumes = {v["name"]: v for v in gateway["volumes"]}
    servers = volumes[mounts["/etc/nginx/conf.d"]]["configMap"]["name"]
    block = docs[("gateway.yaml", "ConfigMap", servers)]["data"]["flower.conf"]
    _assert_flower_block(block, "http://flower.video-factory.svc:5555")


# --- the operations console (`factory serve`) -----------------------------------------------

CONSOLE_ARGS = ["serve", "--host", "0.0.0.0", "--port", "8080"]
CONSOLE_LIVE = re.compile(r"location ~ (\S+) \{([^}]*)\}")


def _nginx_code(conf: str) -> str:
    return re.sub(r"#.*", "", conf)  # comments may name what the code must not do


def _assert_console_block(conf: str, upstream: str) -> None:
    """Server TLS only (browsers have no client certificate), the scheme and the client's
    address set by the gateway, the live stream passed on unbuffered and kept open."""
    code = _nginx_code(conf)
    for line in ("listen 8444 ssl;", "listen 8444 ssl default_server;", "return 421;",
                 "server_name console.factory.internal localhost 127.0.0.1;",
                 "ssl_certificate /etc/nginx/certs/gateway.pem;",
                 "ssl_certificate_key /etc/nginx/certs/gateway.key;",
                 "proxy_set_header X-Forwarded-Proto https;",
                 "proxy_set_header X-Forwarded-For $remote_addr;"):  # fmt: skip
        assert line in code, line
    assert "ssl_verify_client" not in code and "ssl_client_certificate" not in code
    assert "auth_basic" not in code  # the console's own tokens decide who may do what
    assert upstream in code
    live = [(pattern, body) for pattern, body in CONSOLE_LIVE.findall(code) if "live" in pattern]
    assert len(live) == 1, "one location for the live stream"
    [(pattern, body)] = live
    assert re.search(pattern, "/batches/night-1/live") and not re.search(pattern, "/batches/x")
    assert not re.search(pattern, "/batches/night-1/live/more")
    assert "proxy_buffering off;" in body
    timeout = re.search(r"proxy_read_timeout (\d+)(h|m|s)?;", body)
    assert timeout, "the live stream needs a long read timeout"
    seconds = int(timeout.group(1)) * {"h": 3600, "m": 60, "s": 1, None: 1}[timeout.group(2)]
    assert seconds >= 3600
    for passed in re.findall(r"proxy_pass (\S+);", code):  # every location to the console
        assert passed in (upstream, "$console_upstream"), passed


def test_compose_console_is_reached_only_through_the_gateway(compose: dict) -> None:
    services = compose["services"]
    console, gateway = services["console"], services["gateway"]
    assert console["command"] == CONSOLE_ARGS
    assert console["image"] == services["cpu-worker"]["image"]  # the factory's own image
    assert not console.get("ports")
    raw = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]["console"]
    assert "env/console.env" in raw["env_file"]  # its settings: from console.env.example here
    assert console["environment"]["FACTORY_CONSOLE_SESSION_HOURS"]
    # Networks: backend (PostgreSQL, Redis, the gateway's S3) and console-link, which holds the
    # gateway and the console alone; never storage.
    assert set(console["networks"]) == {"backend", "console-link"}
    link = compose["networks"]["console-link"]
    assert link.get("internal") is True
    on_link = {name for name, s in services.items() if "console-link" in s.get("networks", {})}
    assert on_link == {"gateway", "console"}
    subnet = ipaddress.ip_network(link["ipam"]["config"][0]["subnet"])
    gateway_address = gateway["networks"]["console-link"]["ipv4_address"]
    assert ipaddress.ip_address(gateway_address) in subnet
    # The console trusts X-Forwarded-* from the gateway's fixed address, nothing else; the
    # gateway proxies to an alias that exists on console-link only, so it connects from there.
    env = console["environment"]
    settings = parse_console_settings(env)  # the values the console itself accepts
    assert settings.secure_cookies == "always"
    assert settings.trusted_proxies == gateway_address
    assert console["networks"]["console-link"]["aliases"] == ["console-upstream"]
    assert not (console["networks"]["backend"] or {}).get("aliases")
    # The store through the gateway with its own client pair (the mounts: the test above).
    assert env["FACTORY_S3_ENDPOINT_URL"] == "https://gateway:8443"
    assert env["FACTORY_STORE_URL"].startswith("s3://")
    assert env["FACTORY_S3_CLIENT_CERT"] == "/etc/factory/pki/client.pem"
    assert "gateway" in console["depends_on"] and "console" not in gateway.get("depends_on", {})
    health = _text(console["healthcheck"]["test"])
    assert "http://127.0.0.1:8080/healthz" in health
    published = [(host, port) for host, port, target in _ports(gateway) if target == "8444"]
    assert published and all(port == "8444" for _, port in published)  # browsers: https://HOST:8444
    _assert_console_block(
        (DOCKER / "nginx.d" / "console.conf").read_text(), "http://console-upstream:8080"
    )
    for name, service in services.items():  # the console's settings are the console's
        if name != "console":
            assert not [k for k in service.get("environment", {}) if "CONSOLE" in k], name


def test_kubernetes_console_sits_behind_the_gateway() -> None:
    docs = dict(((n, d["kind"], d["metadata"]["name"]), d) for n, d in manifests())
    deployment = docs[("console.yaml", "Deployment", "console")]
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["template"]["metadata"]["labels"] == {"app": "console", "tier": "app"}
    [container] = pod["containers"]
    assert container["args"] == CONSOLE_ARGS
    assert container["image"].startswith(OWN_IMAGES)
    assert [p["containerPort"] for p in container["ports"]] == [8080]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}, probe
    # Unprivileged on a read-only root (every pod: the test above), its secrets 0440.
    own = container["securityContext"]
    assert own["readOnlyRootFilesystem"] is True and own["allowPrivilegeEscalation"] is False
    assert own["capabilities"] == {"drop": ["ALL"]} and own["runAsUser"] == 10001
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["pki"]["secret"] == {"secretName": "factory-console-pki", "defaultMode": 0o440}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/etc/factory/pki"]["name"] == "pki" and mounts["/etc/factory/pki"]["readOnly"]
    # The database, broker and Redis URLs and the store's keys (factory-secrets), the store's
    # paths (factory-s3), its own settings; never Flower's basic auth or another's client pair.
    sources = [next(iter(ref.values()))["name"] for ref in container["envFrom"]]
    assert sources == ["factory-config", "factory-s3", "factory-console", "factory-secrets"]
    for (_, _, name), doc in docs.items():
        for other in _pods(doc):
            if name != "console":
                assert "factory-console-pki" not in json.dumps(other), name
    assert "factory-flower" not in json.dumps(pod) and '"factory-pki"' not in json.dumps(pod)
    config = docs[("console.yaml", "ConfigMap", "factory-console")]["data"]
    settings = parse_console_settings(config)
    assert settings.secure_cookies == "always"
    # The gateway pods' network, never every peer (only the gateway's pods connect: below).
    trusted = [ipaddress.ip_network(p) for p in settings.trusted_proxies.split(",")]
    assert trusted and all(n.is_private and n.prefixlen >= 8 for n in trusted), trusted
    assert not any(ipaddress.ip_address("127.0.0.1") in n for n in trusted)
    service = docs[("console.yaml", "Service", "console")]
    assert service["spec"]["selector"] == {"app": "console"}
    assert [p["port"] for p in service["spec"]["ports"]] == [8080]
    # The gateway: a console port, and the console's server block in its conf.d.
    gateway = docs[("gateway.yaml", "Deployment", "gateway")]["spec"]["template"]["spec"]
    [nginx] = gateway["containers"]
    assert {"name": "console", "containerPort": 8444} in nginx["ports"]
    gateway_service = docs[("gateway.yaml", "Service", "gateway")]["spec"]["ports"]
    assert {"name": "console", "port": 8444, "targetPort": "console"} in gateway_service
    servers = {v["name"]: v for v in gateway["volumes"]}["servers"]["configMap"]["name"]
    block = docs[("gateway.yaml", "ConfigMap", servers)]["data"]["console.conf"]
    _assert_console_block(block, "http://console.video-factory.svc:8080")


def _selector_matches(selector: dict, labels: dict) -> bool:
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        value, operator = labels.get(expression["key"]), expression["operator"]
        if operator == "In" and value not in expression["values"]:
            return False
        if operator == "NotIn" and value in expression["values"]:
            return False
        if operator == "Exists" and value is None:
            return False
        if operator == "DoesNotExist" and value is not None:
            return False
    return True


def _admits(rule: dict, labels: dict, namespace: dict) -> bool:
    """Whether an ingress rule admits a pod with these labels from this namespace."""
    if not rule.get("from"):
        return True
    for peer in rule["from"]:
        if "ipBlock" in peer:
            return True  # pod addresses: assume the worst
        if "namespaceSelector" in peer and not _selector_matches(
            peer["namespaceSelector"], namespace
        ):
            continue
        if _selector_matches(peer.get("podSelector", {}), labels):
            return True
    return False


def test_network_policies_open_exactly_the_console_paths() -> None:
    """gateway -> console:8080, and from the console: PostgreSQL, Redis, the gateway's S3
    port; nothing else in the namespace admits it."""
    policies = [doc for _, doc in manifests() if doc["kind"] == "NetworkPolicy"]
    labels = {
        doc["metadata"]["name"]: doc["spec"]["template"]["metadata"]["labels"]
        for _, doc in manifests()
        if _pods(doc)
    }
    namespace = {"kubernetes.io/metadata.name": "video-factory"}
    console = labels["console"]
    into_console = [p for p in policies if _selector_matches(p["spec"]["podSelector"], console)]
    peers, ports = [], []
    for policy in into_console:
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        for rule in policy["spec"].get("ingress", []):
            peers += rule["from"]
            ports += rule["ports"]
    assert peers == [{"podSelector": {"matchLabels": {"app": "gateway"}}}]
    assert ports == [{"port": 8080, "protocol": "TCP"}]
    targets = {
        "redis": ({"app.kubernetes.io/name": "redis"}, {6379, 26379}),
        "postgres": ({"app.kubernetes.io/name": "postgresql"}, {5432}),
        "gateway": (labels["gateway"], {8443}),
    }
    reached = set()
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            if not _admits(rule, console, namespace):
                continue
            selector = policy["spec"]["podSelector"]
            found = [n for n, (pod, _) in targets.items() if _selector_matches(selector, pod)]
            assert found, f"{policy['metadata']['name']} admits the console"
            for name in found:
                opened = {p["port"] for p in rule.get("ports", [])}
                assert opened and opened <= targets[name][1], (policy["metadata"]["name"], opened)
                reached.add(name)
    assert reached == set(targets)
    for other, other_labels in labels.items():  # nothing but the gateway reaches the console
        if other not in ("console", "gateway"):
            for policy in into_console:
                for rule in policy["spec"].get("ingress", []):
                    assert not _admits(rule, other_labels, namespace), other


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Upstream(http.server.BaseHTTPRequestHandler):
    """The console as the gateway sees it: echoes the request's headers; the live stream sends
    one event, waits for the test's word, then a second one."""

    release = threading.Event()

    def do_GET(self) -> None:
        if self.path.endswith("/live"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(b"data: first\n\n")
            self.wfile.flush()
            self.release.wait(10)
            self.wfile.write(b"data: second\n\n")
            return
        body = json.dumps({"path": self.path, "headers": dict(self.headers)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def gateway_certs(tmp_path_factory) -> Path:
    if shutil.which("nginx") is None:
        pytest.fail("nginx is not installed; `scripts/test` installs nginx-light", pytrace=False)
    root = tmp_path_factory.mktemp("gateway-pki")
    for args in (["ca"], ["server", "gateway", "--host", "localhost", "--host", "127.0.0.1"]):
        done = subprocess.run(
            ["bash", str(REPO / "scripts" / "make-certs"), "--ca-dir", str(root / "ca"),
             "--out", str(root / "certs"), *args],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    return root / "certs"


def _console_blocks() -> dict[str, tuple[dict[str, str], str]]:
    """Each deployment's conf.d for the gateway, and the console's upstream in it."""
    k8s = next(d for n, d in manifests() if n == "gateway.yaml" and d["kind"] == "ConfigMap")
    compose = {p.name: p.read_text() for p in sorted((DOCKER / "nginx.d").glob("*.conf"))}
    return {  # Kubernetes' Flower block names a Service that does not resolve here
        "compose": (compose, "http://console-upstream:8080"),
        "kubernetes": ({"console.conf": k8s["data"]["console.conf"]},
                       "http://console.video-factory.svc:8080"),
    }  # fmt: skip


@pytest.mark.parametrize("deployment", ["compose", "kubernetes"])
def test_the_gateway_serves_the_console_over_server_tls(
    deployment: str, gateway_certs: Path, tmp_path: Path
) -> None:
    """nginx-mtls.conf with the deployment's conf.d, run: no client certificate asked of a
    browser, X-Forwarded-Proto/For set by the gateway whatever the client sent, each live
    event passed on at once."""
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    _Upstream.release.clear()
    conf_d, console_upstream = _console_blocks()[deployment]
    port = _free_port()
    user = "\nuser root root;" if os.geteuid() == 0 else ""  # as root: workers as root too
    swaps = {
        "pid /tmp/nginx-mtls.pid;": f"pid {tmp_path}/nginx.pid;",
        "error_log /dev/stderr info;": f"error_log {tmp_path}/error.log info;",
        "access_log /dev/stdout s3;": f"access_log {tmp_path}/access.log s3;",
        "/tmp/nginx-mtls-": f"{tmp_path}/nginx-",
        "server minio:9000;": f"server 127.0.0.1:{_free_port()};",
        "listen 8443 ssl;": f"listen 127.0.0.1:{_free_port()} ssl;",
        "listen 5556 ssl;": f"listen 127.0.0.1:{_free_port()} ssl;",
        "listen 8444 ssl;": f"listen 127.0.0.1:{port} ssl;",
        "listen 8444 ssl default_server;": f"listen 127.0.0.1:{port} ssl default_server;",
        console_upstream: f"http://127.0.0.1:{upstream.server_port}",
        "/etc/nginx/certs/": f"{gateway_certs}/",
        "include /etc/nginx/conf.d/*.conf;": f"include {tmp_path}/conf.d/*.conf;",
        "worker_processes auto;": f"worker_processes 1;{user}",
    }
    (tmp_path / "conf.d").mkdir()
    texts = {"nginx.conf": (DOCKER / "nginx-mtls.conf").read_text()} | {
        f"conf.d/{name}": text for name, text in conf_d.items()
    }
    for name, text in texts.items():
        for old, new in swaps.items():
            text = text.replace(old, new)
        (tmp_path / name).write_text(text)
    assert console_upstream not in (tmp_path / "conf.d" / "console.conf").read_text()
    nginx = ["nginx", "-p", str(tmp_path), "-e", str(tmp_path / "error.log"),
             "-c", str(tmp_path / "nginx.conf")]  # fmt: skip
    checked = subprocess.run([*nginx, "-t"], capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stderr
    server = subprocess.Popen([*nginx, "-g", "daemon off;"], stderr=subprocess.PIPE)
    try:
        wait_port(port, timeout=10, process=server)
        tls = ssl.create_default_context(cafile=str(gateway_certs / "ca.pem"))  # no client pair
        for path in ("/api/v1/batches?limit=5", "/media/j1/final.mp4", "/"):
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=tls, timeout=10)
            conn.request("GET", path, headers={"X-Forwarded-Proto": "http",
                                               "X-Forwarded-For": "203.0.113.9"})  # fmt: skip
            answer = conn.getresponse()
            assert answer.status == 200, (path, answer.status)
            seen = json.loads(answer.read())
            conn.close()
            headers = {k.lower(): v for k, v in seen["headers"].items()}
            assert seen["path"] == path
            assert headers["x-forwarded-proto"] == "https", path
            assert headers["x-forwarded-for"] == "127.0.0.1", path  # replaced, not appended
            assert headers["host"] == f"127.0.0.1:{port}", path
        # Another Host never reaches the console (the console block's server_name).
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=tls, timeout=10)
        conn.request("GET", "/api/v1/jobs/", headers={"Host": "evil.example"})
        assert conn.getresponse().status == 421
        conn.close()
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=tls, timeout=5)
        conn.request("GET", "/batches/night-1/live", headers={"Accept": "text/event-stream"})
        answer = conn.getresponse()
        assert answer.status == 200
        assert answer.readline() == b"data: first\n"  # before the upstream's stream has ended
        _Upstream.release.set()
        assert b"data: second" in answer.read()
        conn.close()
    finally:
        _Upstream.release.set()
        server.terminate()
        server.wait(10)
        upstream.shutdown()
        upstream.server_close()
