"""CLI commands for the production topology: workers, beat, Flower, the sweeper, `watch`.

They start Celery processes (imported lazily: the rest of `factory/` never imports Celery)
or read PostgreSQL for progress.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time
from datetime import datetime
from typing import TYPE_CHECKING

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from factory.cli import common
from factory.cli.common import err
from factory.config import Settings
from factory.errors import BadInput
from factory.infra.redact import redact, register_secrets
from factory.job import Job
from factory.stages import Stage

if TYPE_CHECKING:
    from factory.ops import Operations


def register(app: typer.Typer) -> None:
    app.command()(worker)
    app.command()(beat)
    app.command()(flower)
    app.command()(sweep)
    app.command()(watch)


def _celery_base(settings: Settings) -> list[str]:
    if not settings.broker_url:
        raise BadInput("is not set: workers need a broker (redis://…)", field="FACTORY_BROKER_URL")
    celery = shutil.which("celery", path=os.path.dirname(sys.executable)) or "celery"
    return [celery, "-A", "tasks.celery_app"]


def _exec(argv: list[str], env: dict[str, str] | None = None) -> None:
    err.print(redact("exec " + " ".join(argv)), markup=False)
    sys.stdout.flush()
    os.execve(argv[0] if os.path.isabs(argv[0]) else shutil.which(argv[0]) or argv[0], argv,
              {**os.environ, **(env or {})})  # fmt: skip


_GPUS = typer.Option(
    None,
    "--gpus",
    help="auto: a worker for every GPU nvidia-smi lists (or a list, 0,2,3), supervised "
    "from this process; the node's topology is recorded (`factory gpu topology`).",
)
_NICE = typer.Option(
    10,
    "--nice",
    min=0,
    max=19,
    help="With --cpu: run the CPU stages this much below normal priority, so that a GPU "
    "worker on the same node never waits behind an encode (0: same priority).",
)
_HEALTH_PORT = typer.Option(
    None,
    "--health-port",
    min=0,
    max=65535,
    help="Serve /livez, /readyz and /metrics on this port (docs/operations.md); "
    "with --gpus, GPU i of the list on PORT+i.",
)
_CPUS = typer.Option(
    None, "--cpus", help="Run on these CPUs only, e.g. 0-31,64-95 (Linux cpulist)."
)
_PIN_CPUS = typer.Option(
    True, "--pin-cpus/--no-pin-cpus", help="With --gpus: each worker on its GPU's NUMA CPUs."
)
_ALLOW_CPU = typer.Option(
    False,
    "--allow-cpu",
    help="With --gpu/--gpus: when there is no such GPU here, run the GPU stages on the CPU "
    "(saying so) instead of refusing to start (FACTORY_WORKER_ALLOW_CPU=1).",
)


def worker(
    gpu: int | None = typer.Option(None, "--gpu", min=0, help="Serve this GPU (one per GPU)."),
    gpus: str | None = _GPUS,
    cpu: bool = typer.Option(False, "--cpu", help="Serve the CPU stages (encode … deliver)."),
    concurrency: int = typer.Option(2, "--concurrency", min=1, help="CPU worker processes."),
    nice: int = _NICE,
    max_tasks: int = typer.Option(500, "--max-tasks-per-child", min=1),
    loglevel: str = typer.Option("info", "--loglevel"),
    health_port: int | None = _HEALTH_PORT,
    cpus: str | None = _CPUS,
    pin_cpus: bool = _PIN_CPUS,
    allow_cpu: bool = _ALLOW_CPU,
) -> None:
    """Start a Celery worker: `--gpu N` (its own queue gpu.<host>.<N> and the shared `gpu`
    queue, one process, on GPU N of those this process sees: nvidia-smi's numbering, a
    container's own view, or the Nth entry of a CUDA_VISIBLE_DEVICES already set), `--gpus
    auto` (one such worker per GPU, supervised) or `--cpu`."""
    if sum((gpu is not None, gpus is not None, cpu)) != 1:
        raise BadInput("give exactly one of --gpu N, --gpus auto or --cpu", field="worker")
    if allow_cpu:
        os.environ["FACTORY_WORKER_ALLOW_CPU"] = "1"  # for the workers --gpus starts, too
    settings = common.settings()
    base = _celery_base(settings)
    if gpus is not None:
        if cpus:
            raise BadInput(
                "--gpus pins each worker to its own GPU's CPUs; --cpus is for one worker "
                "(--no-pin-cpus leaves them unpinned)",
                field="--cpus",
            )
        raise typer.Exit(_gpu_pool(settings, gpus, max_tasks, loglevel, health_port, pin_cpus))
    if cpus:
        _pin_to(cpus)
    host = socket.gethostname()
    name = f"gpu{gpu}" if gpu is not None else "cpu"
    health = _health_env(settings, name, health_port)
    if gpu is not None:
        health["FACTORY_GPU_INDEX"] = str(gpu)
    argv = [*base, "worker", "-P", "prefork", f"--max-tasks-per-child={max_tasks}", "-l",
            loglevel, "-E"]  # fmt: skip
    if gpu is not None:
        _exec_gpu_worker(settings, argv, gpu, host, health)
        return
    if nice:
        os.nice(nice)  # inherited by the worker's processes and the encoders they start
    _exec([*argv, "-c", str(concurrency), "-Q", "cpu", "-n", f"cpu@{host}"],
          {"FACTORY_GPU_QUEUE": "", **health})  # fmt: skip


def _gpu_pool(
    settings: Settings,
    gpus: str,
    max_tasks: int,
    loglevel: str,
    health_port: int | None,
    pin_cpus: bool,
) -> int:
    """`--gpus`: a worker per GPU, supervised from this process until they stop."""
    from factory.cli.topology import run_gpu_pool

    options = ["--max-tasks-per-child", str(max_tasks), "--loglevel", loglevel]
    return run_gpu_pool(settings, gpus, options, health_port, pin_cpus)


def _exec_gpu_worker(
    settings: Settings, argv: list[str], gpu: int, host: str, health: dict[str, str]
) -> None:
    """Become the worker of GPU `gpu`: one process, its own queue first, then the shared one."""
    from tasks.queues import gpu_queue  # the CLI is the edge where factory/ meets tasks/

    queue = gpu_queue(gpu, host)
    # PCI order: CUDA's default (fastest first) may number a mixed node's GPUs unlike
    # nvidia-smi, NVML (readiness) and the recorded topology.
    cuda = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": _gpu_device(settings, gpu)}  # fmt: skip
    if cuda["CUDA_VISIBLE_DEVICES"].isdigit():
        health["FACTORY_GPU_INDEX"] = cuda["CUDA_VISIBLE_DEVICES"]  # NVML's numbering
    # Own queue first: with the broker's "priority" queue order (tasks/celery_app.py) this
    # worker takes its job's next segment before any new job from the shared queue.
    _exec([*argv, "-c", "1", "-Q", f"{queue},gpu", "-n", f"gpu{gpu}@{host}"],
          {**cuda, "FACTORY_GPU_QUEUE": queue, **health})  # fmt: skip


def _gpu_device(settings: Settings, gpu: int) -> str:
    """CUDA_VISIBLE_DEVICES for `--gpu N`: never an index this process cannot see, and no
    GPU at all only when the CPU is allowed (factory/generate/devices.py)."""
    from factory.generate.devices import GpuNotUsable, choose_device, list_gpus

    inherited = os.environ.get("CUDA_VISIBLE_DEVICES")
    listed, how = list_gpus(settings.nvidia_smi) if inherited is None else (0, "")
    try:
        choice = choose_device(gpu, inherited, listed, how, settings.worker_allow_cpu)
    except GpuNotUsable as error:
        raise BadInput(str(error), field=f"--gpu {gpu}") from None
    if choice.note:
        err.print(choice.note, markup=False)
    return choice.cuda_visible_devices


def _pin_to(cpus: str) -> None:
    """Keep this process (and the Celery worker it becomes) on these CPUs, as far as this
    machine or container has them."""
    from factory.gpu.topology import parse_cpu_list

    try:
        wanted = set(parse_cpu_list(cpus))
    except ValueError as error:
        raise BadInput(str(error), field="--cpus") from None
    usable = wanted & os.sched_getaffinity(0)
    if not usable:
        err.print(f"--cpus {cpus}: none of these CPUs is available here; not pinned")
        return
    os.sched_setaffinity(0, usable)


def _health_env(settings: Settings, name: str, port: int | None) -> dict[str, str]:
    """The health endpoint's port, and a fresh folder where this worker's processes keep
    their Prometheus counters (multiprocess mode)."""
    if port is None:
        return {}
    common.check_health_port(settings.health.host, port)
    folder = settings.home / "metrics" / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return {"FACTORY_HEALTH_PORT": str(port), "PROMETHEUS_MULTIPROC_DIR": str(folder)}


def beat() -> None:
    """Start Celery beat: runs the sweeper every FACTORY_SWEEP_EVERY seconds (run only one).

    Beat runs inside a one-process worker that consumes only the `control` queue, so a sweep
    is never stuck behind encodes on the CPU workers (a sweep not started within its period
    expires; the next one replaces it)."""
    settings = common.settings()
    settings.home.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname()
    _exec([*_celery_base(settings), "worker", "-B", "-P", "solo", "-Q", "control",
           "-n", f"control@{host}", "-l", "info",
           "--schedule", str(settings.home / "celerybeat-schedule")],
          {"FACTORY_GPU_QUEUE": ""})  # fmt: skip


def flower(
    port: int = typer.Option(5555, "--port"),
    address: str = typer.Option("127.0.0.1", "--address"),
) -> None:
    """Start Flower with basic auth (FACTORY_FLOWER_BASIC_AUTH=user:password, required) and
    persistent state (FACTORY_HOME/flower.db).

    The password is passed to Flower in its environment (FLOWER_BASIC_AUTH), never on a
    command line, where every user of the host could read it (ps, /proc/PID/cmdline). Flower
    can shut workers down: serve it behind the TLS gateway (docs/deploy.md)."""
    settings = common.settings()
    basic_auth = settings.flower_basic_auth
    user, _, password = basic_auth.partition(":")
    if not user or not password or "," in basic_auth:
        raise BadInput(
            "must be user:password (the password is read from the environment only, "
            "never from the command line)",
            field="FACTORY_FLOWER_BASIC_AUTH",
        )
    register_secrets([basic_auth, password])
    settings.home.mkdir(parents=True, exist_ok=True)
    _exec([*_celery_base(settings), "flower", f"--address={address}", f"--port={port}",
           "--persistent=True", f"--db={settings.home / 'flower.db'}"],
          {"FLOWER_BASIC_AUTH": basic_auth})  # fmt: skip


def sweep() -> None:
    """Run the sweeper once, here: resume stale jobs from their recorded stage and segment."""
    _celery_base(common.settings())
    from tasks.jobs import sweep as sweep_task

    result = sweep_task()
    print(f"resumed {len(result['resumed'])}: {' '.join(result['resumed']) or '-'}")
    print(f"failed {len(result['failed'])}: {' '.join(result['failed']) or '-'}")


def watch(
    batch: str | None = typer.Argument(None, help="Only this batch."),
    every: float = typer.Option(2.0, "--every", min=0.2, help="Seconds between refreshes."),
    once: bool = typer.Option(False, "--once", help="Print one snapshot and exit."),
    window: str | None = typer.Option(
        None, "--window", help="The night's window, HH:MM-HH:MM: show the batch ETA against it."
    ),
    gpus: int = typer.Option(0, "--gpus", min=0, help="GPUs working on it (0: count them)."),
) -> None:
    """Live per-job progress from the database: segments, stage, time left (each job's own
    measured pace, or the forecast's estimate before its first segment); with --window, the
    batch's ETA against the window's end (the console's ETA, on the GPUs at work)."""
    from factory.cli import common

    ops = common.operations(send=False)
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    window_end = _window_end(window)
    if once:
        console.print(_snapshot(ops, batch, window_end, gpus))
        return
    with Live(console=console, refresh_per_second=2) as live:
        while True:
            found = ops.all_jobs(batch)
            live.update(_snapshot(ops, batch, window_end, gpus, found))
            if found and all(j.stage.is_terminal for j in found):
                return
            time.sleep(every)


def _window_end(window: str | None) -> datetime | None:
    if window is None:
        return None
    from factory.ops.forecast import parse_window

    return parse_window(window, datetime.now().astimezone())[1]


def _snapshot(
    ops: Operations,
    batch: str | None,
    window_end: datetime | None = None,
    gpus: int = 0,
    found: list[Job] | None = None,
) -> Group:
    found = ops.all_jobs(batch) if found is None else found
    left = ops.time_left(found)
    table = Table("JOB", "STAGE", "SEGMENTS", "", "LEFT", "WORKER")
    for job in found:
        p = job.progress
        done, total = len(p["segments"]), p["segments_total"]
        width = 24
        filled = int(width * done / total) if total else width
        bar = "█" * filled + "·" * (width - filled)
        table.add_row(
            job.job_id,
            job.stage.value,
            f"{done}/{total}",
            bar,
            _duration(left[job.job_id]) if job.job_id in left else "-",
            job.claimed_by or "-",
        )
    finished = sum(j.stage is Stage.DONE for j in found)
    failed = sum(j.stage in (Stage.FAILED, Stage.CANCELLED) for j in found)
    footer = (f"{finished} done, {failed} failed or cancelled, {len(found) - finished - failed} "
              f"in progress; work left: {_duration(sum(left.values()))}")  # fmt: skip
    if window_end is None:
        return Group(table, footer)
    working = gpus or max(1, sum(j.stage is Stage.GENERATE and bool(j.claimed_by)
                                 for j in found))  # fmt: skip
    return Group(table, footer, _against_window(ops.eta(batch, gpus=working), window_end,
                                                working))  # fmt: skip


def _against_window(eta: datetime | None, window_end: datetime, working: int) -> str:
    eta = eta or datetime.now().astimezone()  # nothing left: done now
    spare = (window_end - eta).total_seconds()
    verdict = (f"on time, {_duration(spare)} to spare" if spare >= 0
               else f"LATE by {_duration(-spare)}")  # fmt: skip
    return (f"batch ETA {eta.astimezone():%a %H:%M} on {working} GPU(s); window ends "
            f"{window_end:%a %H:%M}: {verdict}")  # fmt: skip


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
