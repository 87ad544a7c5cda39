"""`factory worker --gpus auto` with real Celery workers: a worker per GPU that nvidia-smi
lists (a script prints a fixture in its place on this GPU-less machine), each on its own
queue and pinned to its GPU's CPUs, the topology recorded for placement, a crashed worker
started again, and SIGTERM passed on to all of them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest
import requests
from celery import Celery

from factory.gpu.registry import GpuRegistry
from factory.stages import Stage
from tests.conftest import run_cli
from tests.integration.cluster import BROKER, Cluster, manifest
from tests.integration.test_health import wait_for
from tests.s3stand import free_port_block

FIXTURE = Path(__file__).parents[1] / "data" / "topology" / "a100-pcie-4gpu-bridged.txt"
GPU_LIST = "".join(
    f"{i}, GPU-{i:08d}-aaaa-bbbb-cccc-dddddddddddd, NVIDIA A100 80GB PCIe, "
    f"00000000:{0x17 + i:02X}:00.0, 81920\n"
    for i in range(4)
)


def fake_nvidia_smi(tmp_path: Path) -> Path:
    """A stand-in for nvidia-smi answering the two questions the pool asks. The fixture's
    CPU affinities are narrowed to this machine's CPUs so that pinning can be observed."""
    cpus = sorted(os.sched_getaffinity(0))
    first, last = cpus[0], cpus[-1]
    topo = FIXTURE.read_text().replace("0-27,56-83", str(last)).replace("28-55,84-111", str(first))
    (tmp_path / "topo.txt").write_text(topo)
    (tmp_path / "gpus.csv").write_text(GPU_LIST)
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'case "$1" in\n  topo) cat "{tmp_path}/topo.txt" ;;\n'
        f'  --query-gpu=*) cat "{tmp_path}/gpus.csv" ;;\n'
        '  *) echo "unexpected: $*" >&2; exit 9 ;;\nesac\n'
    )
    script.chmod(0o755)
    return script


def pool_children(pool: subprocess.Popen) -> dict[int, int]:
    """GPU -> pid of its worker (the child process, become `celery worker -n gpuN@…`)."""
    found = {}
    pids = subprocess.run(["pgrep", "-P", str(pool.pid)], capture_output=True, text=True).stdout
    for pid in map(int, pids.split()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        for arg in cmdline:
            if arg.startswith(b"gpu") and b"@" in arg:
                found[int(arg[3 : arg.index(b"@")])] = pid
    return found


def allowed_cpus(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Cpus_allowed_list for {pid}")


def live(port: int) -> bool:
    return requests.get(f"http://127.0.0.1:{port}/livez", timeout=2).status_code == 200


def test_a_worker_per_gpu_with_its_topology_recorded(cluster: Cluster, tmp_path: Path):
    host = socket.gethostname()
    port = free_port_block(4)
    cluster.env_overrides.update(
        FACTORY_NVIDIA_SMI=str(fake_nvidia_smi(tmp_path)), FACTORY_GPU_MEMORY_SOURCE="none"
    )
    pool = cluster.start("pool", "worker", "--gpus", "auto", "--health-port", str(port))
    cluster.start("cpu", "worker", "--cpu")
    cluster.start("beat", "beat")
    try:
        for i in range(4):
            wait_for(
                lambda i=i: live(port + i), timeout=90, what=f"GPU {i}'s worker", logs=cluster.logs
            )

        # Each GPU's worker consumes its own queue (and the shared one).
        queues = Celery(broker=BROKER).control.inspect(timeout=10).active_queues() or {}
        for i in range(4):
            names = {q["name"] for q in queues[f"gpu{i}@{host}"]}
            assert names == {f"gpu.{host}.{i}", "gpu"}, names

        # The topology is recorded, with each GPU's queue; placement uses it.
        [node] = GpuRegistry(cluster.factory().database).nodes()
        assert node.host == host and node.topology.groups() == [[0, 1], [2, 3]]
        assert node.queues == {i: f"gpu.{host}.{i}" for i in range(4)}
        assert node.topology.gpu(3).info.name == "NVIDIA A100 80GB PCIe"
        placement = GpuRegistry(cluster.factory().database).place(2, busy_queues=[f"gpu.{host}.0"])
        assert placement.gpus == [2, 3] and placement.nvlinks == 12
        shown = run_cli("gpu", "topology", "--place", "2", env=cluster.env)
        assert shown.returncode == 0, shown.stderr
        assert f"gpu.{host}.3" in shown.stdout and "narrowest link NV12" in shown.stdout

        # Pinned to the GPU's NUMA CPUs (the fixture's affinities were narrowed to ours).
        children = pool_children(pool)
        assert sorted(children) == [0, 1, 2, 3]
        cpus = sorted(os.sched_getaffinity(0))
        assert allowed_cpus(children[0]) == str(cpus[-1])
        assert allowed_cpus(children[2]) == str(cpus[0])

        # Work is done by them.
        [job_id] = cluster.submit(manifest(tmp_path / "m.yaml", "pool", videos=1))
        [job] = cluster.wait_done([job_id])
        assert job.stage is Stage.DONE, cluster.logs()
        workers = {e.detail.get("worker") for e in cluster.factory().jobs.events(job_id)}
        assert any(f"/gpu.{host}." in str(w) for w in workers), workers  # host/queue/pid

        # A worker that dies is started again.
        os.killpg(children[1], signal.SIGKILL)
        wait_for(lambda: pool_children(pool).get(1, children[1]) != children[1], what="restart")
        wait_for(lambda: live(port + 1), timeout=90, what="GPU 1's worker again", logs=cluster.logs)
        assert "gpu_pool.child_exited" in (cluster.home / "pool.log").read_text()

        # SIGTERM reaches every worker; the pool exits once they all have.
        children = pool_children(pool)
        pool.send_signal(signal.SIGTERM)
        assert pool.wait(timeout=60) == 0, cluster.logs()
        for pid in children.values():
            assert not Path(f"/proc/{pid}").exists() or _zombie(pid), f"{pid} still runs"
    finally:
        for pid in pool_children(pool).values():
            _kill_group(pid)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus", "auto", "--cpu"], "give exactly one of --gpu N, --gpus auto or --cpu"),
        (["--gpus", "0,x"], "'0,x': give auto or GPU numbers"),
        (["--gpus", "0,7"], "no GPU 7 on this node (it has 0,1,2,3)"),
        (["--gpus", "auto", "--cpus", "0-3"], "--cpus is for one worker"),
    ],
)
def test_bad_gpu_lists_are_named(tmp_path: Path, args: list[str], message: str):
    env = {"FACTORY_HOME": str(tmp_path), "FACTORY_BROKER_URL": BROKER,
           "FACTORY_NVIDIA_SMI": str(fake_nvidia_smi(tmp_path))}  # fmt: skip
    done = run_cli("worker", *args, env=env)
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_no_driver_is_explained(tmp_path: Path):
    env = {"FACTORY_HOME": str(tmp_path), "FACTORY_BROKER_URL": BROKER,
           "FACTORY_NVIDIA_SMI": str(tmp_path / "absent")}  # fmt: skip
    done = run_cli("worker", "--gpus", "auto", env=env)
    assert done.returncode == 2
    assert "not found: no NVIDIA driver on this node?" in done.stderr
    assert "--gpus 0,1" in done.stderr


def _zombie(pid: int) -> bool:
    try:
        return " Z " in Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def test_topology_of_a_saved_output(tmp_path: Path):
    env = {"FACTORY_HOME": str(tmp_path)}
    h100 = str(FIXTURE.with_name("h100-sxm5-8gpu-nvswitch.txt"))
    done = run_cli("gpu", "topology", "--from", h100, "--place", "4", "--json", env=env)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["nodes"][0]["groups"] == [list(range(8))]
    assert data["placement"]["gpus"] == [0, 1, 2, 3] and data["placement"]["nvlinks"] == 18

    done = run_cli("gpu", "topology", "--from", str(FIXTURE), "--place", "3", env=env)
    assert done.returncode == 3
    assert "NVLink groups {0,1} {2,3}" in done.stdout
    assert "no node has 3 GPUs that are pairwise NVLinked" in done.stdout

    (tmp_path / "bad.txt").write_text("NVIDIA-SMI has failed because it couldn't communicate\n")
    done = run_cli("gpu", "topology", "--from", str(tmp_path / "bad.txt"), env=env)
    assert done.returncode == 2 and "no header line with GPU0" in done.stderr
    done = run_cli("gpu", "topology", "--from", str(tmp_path / "absent.txt"), env=env)
    assert done.returncode == 2 and "absent.txt" in done.stderr


@pytest.mark.parametrize("args", [["--gpu", "0"], ["--cpu"], ["--gpus", "auto"]])
def test_a_health_port_in_use_is_refused_before_the_worker_starts(tmp_path: Path, args: list[str]):
    env = {"FACTORY_HOME": str(tmp_path), "FACTORY_BROKER_URL": BROKER,
           "FACTORY_NVIDIA_SMI": str(fake_nvidia_smi(tmp_path))}  # fmt: skip
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        port = taken - 2 if "--gpus" in args else taken  # the pool's GPU 2 gets PORT+2
        done = run_cli("worker", *args, "--health-port", str(port), env=env)
    assert done.returncode == 2, done.stderr
    assert "--health-port" in done.stderr and f"0.0.0.0:{taken} cannot be bound" in done.stderr
