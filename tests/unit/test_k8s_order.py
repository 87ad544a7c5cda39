"""docs/deploy.md's Kubernetes steps, run in their order against a model of the cluster,
offline: each `kubectl apply` renders what it names (kustomize's resources and `images:`,
its `-l` filter), checks every object against the API schema (kubernetes-validate), and
checks that what the object needs exists by then: its namespace, the ConfigMaps, Secrets
and volume claims its pods read, the migration finished before anything that uses the
database rolls, and every image one the docs pushed."""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.conftest import REPO

K8S = REPO / "docker" / "k8s"
DEPLOY = REPO / "docs" / "deploy.md"
SECTION = "## Several nodes: Kubernetes"
NAMESPACED = {"ConfigMap", "Secret", "Deployment", "Job", "Service", "NetworkPolicy",
              "PodDisruptionBudget", "PersistentVolumeClaim"}  # fmt: skip


def _steps() -> list[list[str]]:
    """The shell commands of the Kubernetes section's code blocks, in order."""
    text = DEPLOY.read_text()
    section = text[text.index(SECTION) :]
    section = section[: section.index("\n## ", 1)]
    commands, inside, pending = [], False, ""
    for line in section.splitlines():
        if line.startswith("```"):
            inside = not inside
            continue
        if not inside:
            continue
        pending += line.rstrip("\\") + " " if line.endswith("\\") else line
        if line.endswith("\\"):
            continue
        words = shlex.split(pending, comments=True)
        pending = ""
        if words:
            commands.append(words)
    return commands


def _kustomize(folder: Path, selector: dict[str, str] | None = None) -> list[dict]:
    """What `kubectl apply -k folder [-l k=v]` sends: its resources in order, their images
    renamed as `images:` says, only the objects whose labels match."""
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    renames = {i["name"]: i for i in kustomization.get("images", [])}
    found = []
    for resource in kustomization["resources"]:
        for doc in yaml.safe_load_all((folder / resource).read_text()):
            if not doc:
                continue
            for container in _containers(doc):
                name, _, tag = container["image"].partition(":")
                if name in renames:
                    new = renames[name]
                    container["image"] = f"{new.get('newName', name)}:{new.get('newTag', tag)}"
            labels = doc["metadata"].get("labels", {})
            if selector is None or selector.items() <= labels.items():
                found.append(doc)
    return found


def _pod(doc: dict) -> dict | None:
    if doc["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
        return doc["spec"]["template"]["spec"]
    return None


def _containers(doc: dict) -> list[dict]:
    pod = _pod(doc)
    return [*pod.get("initContainers", []), *pod["containers"]] if pod else []


def _needs(doc: dict) -> set[tuple[str, str]]:
    """(kind, name) of every ConfigMap, Secret and claim the object's pods read."""
    pod = _pod(doc)
    if pod is None:
        return set()
    needs = set()
    for container in _containers(doc):
        for source in container.get("envFrom", []):
            if "configMapRef" in source:
                needs.add(("ConfigMap", source["configMapRef"]["name"]))
            if "secretRef" in source:
                needs.add(("Secret", source["secretRef"]["name"]))
        for variable in container.get("env", []):
            ref = variable.get("valueFrom", {})
            if "secretKeyRef" in ref:
                needs.add(("Secret", ref["secretKeyRef"]["name"]))
            if "configMapKeyRef" in ref:
                needs.add(("ConfigMap", ref["configMapKeyRef"]["name"]))
    for volume in pod.get("volumes", []):
        if "secret" in volume:
            needs.add(("Secret", volume["secret"]["secretName"]))
        if "configMap" in volume:
            needs.add(("ConfigMap", volume["configMap"]["name"]))
        if "persistentVolumeClaim" in volume:
            needs.add(("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]))
    return needs


@dataclass
class Cluster:
    """What exists after each step, by (kind, namespace, name)."""

    objects: set[tuple[str, str, str]] = field(default_factory=set)
    completed_jobs: set[str] = field(default_factory=set)
    pushed: set[str] = field(default_factory=set)
    variables: dict[str, str] = field(default_factory=dict)
    applied: list[dict] = field(default_factory=list)

    def has(self, kind: str, namespace: str, name: str) -> bool:
        return (kind, namespace, name) in self.objects

    def apply(self, docs: list[dict], step: str) -> None:
        batch = {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])
                 for d in docs}  # fmt: skip
        for doc in docs:
            kubernetes_validate.validate(doc, "1.30", strict=True)
            kind, name = doc["kind"], doc["metadata"]["name"]
            namespace = doc["metadata"].get("namespace", "")
            if kind in NAMESPACED:
                assert namespace, f"{step}: {kind} {name} names no namespace"
                assert self.has("Namespace", "", namespace), (
                    f"{step}: {kind} {name} before its namespace {namespace}"
                )
            for need_kind, need in sorted(_needs(doc)):
                key = (need_kind, namespace, need)
                assert key in self.objects or key in batch, (
                    f"{step}: {kind} {name} needs {need_kind} {need}, which does not exist yet"
                )
            for container in _containers(doc):
                image = container["image"]
                if "video-factory" in image:
                    assert image in self.pushed, f"{step}: {kind} {name} runs {image}: not pushed"
            uses_database = any(c.get("args") != ["db", "upgrade"] for c in _containers(doc))
            if "video-factory" in str(_containers(doc)) and uses_database:
                assert "factory-migrate" in self.completed_jobs, (
                    f"{step}: {kind} {name} starts before the migration has finished"
                )
        self.objects |= batch
        self.applied += docs

    def run(self, words: list[str]) -> None:
        step = " ".join(words)
        while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
            name, _, value = words.pop(0).partition("=")
            self.variables[name] = value
        words = [re.sub(r"\$(\w+)", lambda m: self.variables[m.group(1)], w) for w in words]
        if not words:
            return
        if words[:2] == ["docker", "push"]:
            self.pushed.add(words[2])
            return
        if words[0] != "kubectl":
            return  # docker build, scripts/make-certs
        namespace = ""
        if words[1] == "-n":
            namespace, words = words[2], [words[0], *words[3:]]
        verb = words[1]
        if verb == "apply":
            files = [words[i + 1] for i, w in enumerate(words) if w == "-f"]
            selector = {}
            if "-l" in words:
                key, _, value = words[words.index("-l") + 1].partition("=")
                selector = {key: value}
            docs = [d for f in files for d in yaml.safe_load_all((REPO / f).read_text()) if d]
            if "-k" in words:
                docs += _kustomize(REPO / words[words.index("-k") + 1], selector or None)
            assert docs, f"{step}: applies nothing"
            self.apply(docs, step)
        elif verb == "create" and words[2] in ("secret", "configmap"):
            kind = "Secret" if words[2] == "secret" else "ConfigMap"
            name = words[4] if kind == "Secret" else words[3]
            assert self.has("Namespace", "", namespace), f"{step}: before its namespace"
            for source in [w.split("=")[-1] for w in words if w.startswith("--from-file=")]:
                if source.startswith("docker/"):
                    assert (REPO / source).is_file(), f"{step}: no {source}"
            self.objects.add((kind, namespace, name))
        elif verb == "wait":
            job = next(w for w in words if w.startswith("job/")).removeprefix("job/")
            assert "--for=condition=complete" in words, step
            assert self.has("Job", namespace, job), f"{step}: no such job yet"
            self.completed_jobs.add(job)
        elif verb == "delete":
            assert "--ignore-not-found" in words, f"{step}: fails on the first release"
        else:
            pytest.fail(f"a kubectl step this test does not know: {step}")


def test_the_documented_order_gives_every_object_what_it_needs() -> None:
    cluster = Cluster()
    for words in _steps():
        cluster.run(words)
    everything = {(d["kind"], d["metadata"]["name"]) for d in _kustomize(K8S)}
    applied = {(d["kind"], d["metadata"]["name"]) for d in cluster.applied}
    assert everything <= applied, f"never applied: {everything - applied}"
    # every manifest in docker/k8s is part of the kustomization (the PVC was not)
    listed = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    assert set(listed) == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}


def test_the_image_is_named_once() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    [image] = kustomization["images"]
    assert image["name"] == "video-factory" and "/" in image["newName"]
    for path in K8S.glob("*.yaml"):
        assert image["newName"] not in path.read_text() or path.name == "kustomization.yaml"
        for doc in yaml.safe_load_all(path.read_text()):
            for container in _containers(doc) if doc and "spec" in doc else []:
                if "video-factory" in container["image"]:
                    assert container["image"] in ("video-factory:app", "video-factory:gpu")
    rendered = {c["image"] for d in _kustomize(K8S) for c in _containers(d)}
    assert {f"{image['newName']}:app", f"{image['newName']}:gpu"} <= rendered


def test_the_model_catches_a_wrong_order() -> None:
    """The old order: the migration job before the ConfigMap it reads; a missing claim."""
    cluster = Cluster(pushed={"registry.example.com/video-factory:app"})
    cluster.run(["kubectl", "apply", "-f", "docker/k8s/namespace.yaml"])
    cluster.run(["kubectl", "-n", "video-factory", "create", "secret", "generic",
                 "factory-secrets", "--from-env-file=app.env"])  # fmt: skip
    with pytest.raises(AssertionError, match="needs ConfigMap factory-config"):
        cluster.run(["kubectl", "apply", "-k", "docker/k8s", "-l",
                     "app.kubernetes.io/component=migrate"])  # fmt: skip
    gpu = next(d for d in _kustomize(K8S) if d["metadata"]["name"] == "gpu-worker")
    assert ("PersistentVolumeClaim", "factory-models") in _needs(gpu)
    cluster.completed_jobs.add("factory-migrate")
    with pytest.raises(AssertionError, match=r"not pushed|does not exist yet"):
        cluster.apply([gpu], "gpu-worker")


def test_kubectl_kustomize_renders_what_the_model_renders() -> None:
    """The same images and objects from kubectl's own kustomize, where it is installed."""
    done = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True,
                          timeout=60, check=False, env={"PATH": "/usr/bin:/bin"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    theirs = [d for d in yaml.safe_load_all(done.stdout) if d]

    def summary(docs: list[dict]) -> set[tuple[str, str, str]]:
        return {(d["kind"], d["metadata"]["name"],
                 ",".join(sorted(c["image"] for c in _containers(d)))) for d in docs}  # fmt: skip

    assert summary(theirs) == summary(_kustomize(K8S))
