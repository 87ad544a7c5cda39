"""The deployment files, checked offline: no Docker engine runs here, so the compose file is
parsed and resolved by docker-compose itself, the Kubernetes manifests are validated against
the API schemas (kubernetes-validate) and checked for what the factory needs of them."""

from __future__ import annotations

import re
import shutil
import subprocess

import kubernetes_validate
import pytest
import yaml

from tests.conftest import REPO

DOCKER = REPO / "docker"
K8S = DOCKER / "k8s"
SECRET_NAME = re.compile(r"SECRET|PASSWORD|TOKEN|_KEY$|BASIC_AUTH")


@pytest.fixture(scope="module")
def compose(tmp_path_factory) -> dict:
    """docker-compose's own resolution of docker/compose.yaml (anchors, env, defaults)."""
    if shutil.which("docker-compose") is None:
        pytest.fail("docker-compose is not installed; `scripts/test` installs it", pytrace=False)
    root = tmp_path_factory.mktemp("deploy")
    shutil.copytree(DOCKER, root / "docker")
    shutil.copy(DOCKER / "factory.env.example", root / "docker" / "factory.env")
    done = subprocess.run(
        ["docker-compose", "-f", str(root / "docker" / "compose.yaml"), "config"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


def test_compose_has_the_whole_factory_wired_as_the_design_says(compose: dict) -> None:
    services = compose["services"]
    assert {"postgres", "redis", "minio", "gateway", "migrate", "beat", "flower", "cpu-worker",
            "gpu-worker-0", "gpu-worker-1"} <= set(services)  # fmt: skip
    redis_command = " ".join(services["redis"]["command"])
    assert "--maxmemory-policy noeviction" in redis_command
    assert "--appendonly yes" in redis_command
    gateway_mounts = " ".join(str(v) for v in services["gateway"]["volumes"])
    assert "nginx-mtls.conf" in gateway_mounts and "/etc/nginx/nginx.conf" in gateway_mounts
    assert services["migrate"]["command"] == ["db", "upgrade"]
    for name in ("beat", "flower", "cpu-worker", "gpu-worker-0", "gpu-worker-1"):
        needs = services[name]["depends_on"]
        assert needs["migrate"]["condition"] == "service_completed_successfully", name
    seen = set()
    for name in ("gpu-worker-0", "gpu-worker-1"):
        [device] = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["capabilities"] == ["gpu"] and device["driver"] == "nvidia"
        assert device["device_ids"] == [name[-1]]
        assert services[name]["command"][:3] == ["worker", "--gpu", name[-1]]
        seen |= set(device["device_ids"])
    assert seen == {"0", "1"}  # one worker per GPU, none shared
    for name in ("cpu-worker", "gpu-worker-0", "gpu-worker-1"):
        assert "--health-port" in services[name]["command"]


def test_compose_bakes_in_no_secret() -> None:
    text = (DOCKER / "compose.yaml").read_text()
    for line in text.splitlines():
        key = line.strip().split(":", 1)[0]
        if SECRET_NAME.search(key) and not key.startswith("FACTORY_S3_"):  # those are paths
            pytest.fail(f"compose.yaml sets {key} itself; secrets belong in factory.env")
    assert "docker/factory.env" in (REPO / ".gitignore").read_text()


def manifests() -> list[tuple[str, dict]]:
    found = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") != "Kustomization":
                found.append((path.name, doc))
    return found


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
    config = docs[("config.yaml", "ConfigMap")]["data"]
    assert not [key for key in config if SECRET_NAME.search(key) and "FACTORY_S3" not in key]


def test_dockerfiles_copy_what_exists_and_build_no_secret_in() -> None:
    for name in ("Dockerfile", "Dockerfile.gpu"):
        text = (DOCKER / name).read_text()
        for line in text.splitlines():
            if line.startswith("COPY") and "--from" not in line:
                for source in line.split()[1:-1]:
                    assert (REPO / source).exists(), f"{name}: COPY {source}: no such path"
            if line.startswith(("ENV", "ARG")):
                assert not SECRET_NAME.search(line.split()[1].split("=")[0]), line
        assert 'ENTRYPOINT ["factory"]' in text
    gpu = (DOCKER / "Dockerfile.gpu").read_text()
    assert "ARG FLASH_ATTN=0" in gpu and "nvidia/cuda" in gpu
