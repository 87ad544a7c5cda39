"""`factory`: the admin CLI. Tables for people, `--json` for scripts.

Exit codes: 0 success; 2 bad input (manifest, arguments, unknown job) with one message
naming the field; 1 any other failure. No traceback unless `--debug`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from factory import __version__
from factory.cli import cluster as cli_cluster
from factory.cli import common, describe
from factory.cli import forecast as cli_forecast
from factory.cli import gc as cli_gc
from factory.cli import gpu as cli_gpu
from factory.cli import qc as cli_qc
from factory.cli import redo as cli_redo
from factory.cli import schema as cli_schema
from factory.cli import serve as cli_serve
from factory.cli import topology as cli_topology
from factory.cli.common import err, out
from factory.cli.runview import RunDisplay, summary_table
from factory.config import S3Settings
from factory.errors import BadInput, FactoryError
from factory.ops import (
    Operations,
    check_manifest,
    event_dict,
    job_summary,
    local_actor,
    shot_rows,
)
from factory.ops.retention import gc_note
from factory.stages import REQUEUE_TARGETS, Stage
from factory.store import open_store

if TYPE_CHECKING:  # imported where a manifest is read: `factory jobs` and `status` need none
    from factory.manifest import Manifest
    from factory.ops import preflight
    from factory.ops.submit import Submitted

try:  # typer >= 0.2x carries its own copy of click
    from typer.exceptions import TyperException as _CommandLineError
except ImportError:  # pragma: no cover - older typer on top of click
    from click.exceptions import ClickException as _CommandLineError

app = typer.Typer(
    help="Long-video batch factory: submit manifests, follow jobs, requeue and cancel them.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

JsonOption = typer.Option(False, "--json", help="Print JSON for scripts instead of a table.")
STAGE_NAMES = [s.value for s in Stage]


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors."),
    version: bool = typer.Option(False, "--version", help="Print the version and exit."),
) -> None:
    if version:
        out.print(__version__)
        raise typer.Exit(0)


# --- manifests -------------------------------------------------------------------


@app.command()
def validate(
    manifest: Path = typer.Argument(..., help="Manifest file (YAML, or JSON)."),
    batch: str | None = typer.Option(None, "--batch", help="Override the manifest's batch name."),
    as_json: bool = JsonOption,
) -> None:
    """Check a manifest without submitting it: every field, every asset it names (in the
    store or beside the manifest) and every model directory this host can see; print the jobs
    it would create with their effective segment settings. Nothing is written."""
    checked = _preflight(manifest, batch)
    parsed = checked.manifest
    shots = {v.job_id: shot_rows(v) for v in parsed.videos}
    if as_json:
        _print_json([v.to_dict() | {"job_id": v.job_id, "shots": shots[v.job_id]}
                     for v in parsed.videos])  # fmt: skip
        return
    table = Table("JOB", "DURATION", "FPS", "SIZE", "SCENES", "SHOTS", "MODEL", "SEGMENT",
                  "RENDITIONS")  # fmt: skip
    for v in parsed.videos:
        table.add_row(
            v.job_id,
            f"{v.duration:g} s",
            str(v.fps),
            f"{v.width}x{v.height}",
            str(len(v.scenes)),
            str(len(shots[v.job_id])),
            v.model.family,
            f"{v.segment_frames} frames, overlap {v.segment_overlap}",
            ",".join(v.renditions),
        )
    out.print(table)
    if any(len(rows) > 1 for rows in shots.values()):
        listing = Table("JOB", "SHOT", "START", "END", "JOIN", "SCENES", "SEGMENTS")
        for job_id, rows in shots.items():
            for row in rows if len(rows) > 1 else []:
                first, last = row["segments"]
                listing.add_row(job_id, str(row["shot"]), f"{row['start']:g} s",
                                f"{row['end']:g} s", row["join"],
                                ",".join(map(str, row["scenes"])), f"{first}-{last}")  # fmt: skip
        out.print(listing)
    out.print(f"manifest ok: {len(parsed.videos)} videos in batch {parsed.batch}")


def _preflight(manifest: Path, batch: str | None) -> preflight.Preflight:
    """The manifest validated, its assets and model directories checked (warnings printed)."""
    from factory.manifest import load_manifest

    checked = check_manifest(load_manifest(manifest, batch=batch), common.settings())
    for warning in checked.warnings:
        err.print(f"warning: {warning}", markup=False)
    return checked


def _submit_checked(
    manifest: Path, batch: str | None, *, send: bool = True
) -> tuple[Operations, Manifest, Submitted]:
    """Check, put the manifest's local files into the store, then create the jobs (and send
    them to the workers when there is a broker and ``send``)."""
    checked = _preflight(manifest, batch)
    ops = common.operations(send=send)
    return ops, checked.manifest, ops.submit_checked(checked, actor=local_actor())


@app.command()
def submit(
    manifest: Path = typer.Argument(..., help="Manifest file (YAML, or JSON)."),
    batch: str | None = typer.Option(
        None, "--batch", help="Override the manifest's batch name (e.g. nightly-$(date +%F))."
    ),
    as_json: bool = JsonOption,
) -> None:
    """Validate a manifest, check its assets and models, put its local files into the store
    and create one job per video (a resubmission creates nothing)."""
    _, parsed, result = _submit_checked(manifest, batch)
    created = set(result.created)
    if as_json:
        _print_json(
            [
                {
                    "job_id": j.job_id,
                    "batch": j.batch,
                    "video_id": j.spec["video_id"],
                    "stage": j.stage.value,
                    "created": j.job_id in created,
                }
                for j in result.jobs
            ]
        )
        return
    for job in result.jobs:
        out.print(job.job_id)
    fresh = len(created)
    err.print(
        f"{fresh} created, {len(result.jobs) - fresh} already submitted (batch {parsed.batch})"
    )
    if fresh and common.operations().in_process:
        err.print(_NOTHING_RUNS)


# Embedded (no FACTORY_BROKER_URL): recorded work waits for a `factory run` in this home.
_NOTHING_RUNS = (
    "no broker (FACTORY_BROKER_URL is empty): nothing runs it until `factory run MANIFEST` "
    "(the batch's manifest) is run in this FACTORY_HOME"
)


@app.command()
def run(
    manifest: Path = typer.Argument(..., help="Manifest file (YAML, or JSON)."),
    batch: str | None = typer.Option(None, "--batch", help="Override the manifest's batch name."),
    stitch_strength: float = typer.Option(
        1.0, "--stitch-strength", min=0.0, max=1.0, help="Seam colour alignment, 0 (off) to 1."
    ),
) -> None:
    """Submit a manifest and run every stage of its jobs in this process (no servers needed).

    Exits 1 if any job did not finish; `factory requeue` and a second `factory run` continue.
    """
    ops, parsed, submitted = _submit_checked(manifest, batch, send=False)
    settings = ops.settings
    finished, seconds = [], {}
    with RunDisplay(err, submitted.jobs) as display:
        started = time.monotonic()
        for job in ops.run_all_here(
            [j.job_id for j in submitted.jobs], actor="run", observer=display,
            stitch_strength=stitch_strength,
        ):  # fmt: skip
            finished.append(job)
            seconds[job.job_id] = time.monotonic() - started
            started = time.monotonic()
    outputs = ops.published(j.job_id for j in finished)
    out.print(summary_table(finished, seconds, outputs))
    waiting = [j for j in finished if j.stage is Stage.REVIEW]
    failed = [j for j in finished if j.stage not in (Stage.DONE, Stage.REVIEW)]
    store_root = settings.store_url
    out.print(
        f"{len(finished) - len(failed) - len(waiting)} of {len(finished)} videos delivered to "
        f"{store_root}/{parsed.batch}/"
    )
    if waiting:
        out.print(
            f"{len(waiting)} passed QC and wait for review (batch {parsed.batch} requires it): "
            "`factory approve JOB` delivers one, `factory reject JOB --reason TEXT` sends it back"
        )
    if failed:
        err.print(
            f"{len(failed)} job(s) did not finish: `factory status JOB` says why, "
            "`factory requeue JOB` continues"
        )
        raise typer.Exit(1)


store_app = typer.Typer(
    help="The object store (FACTORY_STORE_URL): assets in, outputs out.", no_args_is_help=True
)
app.add_typer(store_app, name="store")


def _store_target() -> tuple[str, S3Settings]:
    settings = common.settings()
    return settings.store_url, settings.s3


@store_app.command("put")
def store_put(
    source: Path = typer.Argument(..., exists=True, dir_okay=False, help="Local file."),
    key: str = typer.Argument(..., help="Key in the store, e.g. beds/harbor.flac."),
) -> None:
    """Copy a local file (an audio bed, say) into the store under KEY."""
    store = open_store(*_store_target())
    store.put_file(key, source)
    out.print(store.url_for(key))


@store_app.command("ls")
def store_ls(prefix: str = typer.Argument("", help="Key prefix, e.g. nightly/harbor.")) -> None:
    """List the keys under PREFIX."""
    for key in open_store(*_store_target()).list(prefix):
        out.print(key)


# --- following jobs ----------------------------------------------------------------


@app.command()
def jobs(
    batch: str | None = typer.Option(None, "--batch", help="Only this batch."),
    stage: str | None = typer.Option(None, "--stage", help=f"Only this stage: {STAGE_NAMES}."),
    limit: int = typer.Option(1000, "--limit", min=1, max=1000, help="At most this many jobs."),
    as_json: bool = JsonOption,
) -> None:
    """List jobs with their stage and progress."""
    wanted = _stage(stage, "--stage") if stage else None
    found = common.operations(send=False).jobs(batch=batch, stage=wanted, limit=limit).items
    if as_json:
        _print_json([job_summary(j) for j in found])
        return
    table = Table("JOB", "STAGE", "SEGMENTS", "ATTEMPT", "UPDATED", "ERROR")
    for job in found:
        p = job.progress
        error = (job.last_error or {}).get("message", "")
        table.add_row(
            job.job_id,
            describe.stage_text(job),
            f"{len(p['segments'])}/{p['segments_total']}",
            str(job.attempt),
            describe.ago(job.updated_at),
            describe.short(error, 40),
        )
    out.print(table)
    if not found:
        err.print(
            "no jobs"
            + (f" in batch {batch}" if batch else "")
            + (f" at stage {stage}" if stage else "")
        )


@app.command()
def status(
    job_id: str = typer.Argument(..., metavar="JOB"),
    as_json: bool = JsonOption,
) -> None:
    """Everything about one job: stage, progress, attempt, outputs, QC, last error."""
    view = common.operations(send=False).job_view(job_id, with_checks=as_json)
    if as_json:  # the API's job, exactly (JobView.to_dict)
        _print_json(view.to_dict())
        return
    for label, value in describe.status_lines(view):
        out.print(f"[bold]{label:<10}[/bold] {value}")


@app.command()
def events(
    job_id: str = typer.Argument(..., metavar="JOB"),
    as_json: bool = JsonOption,
) -> None:
    """The job's timeline: every transition, claim, checkpoint and operator action."""
    timeline = common.operations(send=False).events(job_id)
    if as_json:
        _print_json([event_dict(e) for e in timeline])
        return
    table = Table("AT", "STAGE", "EVENT", "ATTEMPT", "DETAIL")
    for e in timeline:
        detail = ", ".join(f"{k}={v}" for k, v in e.detail.items())
        table.add_row(
            e.at.strftime("%Y-%m-%d %H:%M:%S"),
            e.stage.value,
            e.event,
            str(e.attempt),
            describe.short(detail, 70),
        )
    out.print(table)


# --- operator actions ----------------------------------------------------------------


@app.command()
def requeue(
    job_id: str = typer.Argument(..., metavar="JOB"),
    from_stage: str | None = typer.Option(
        None,
        "--from",
        help="Redo this stage and all later ones from scratch "
        f"({', '.join(s.value for s in REQUEUE_TARGETS)}). "
        "Without it the job continues where it stopped, keeping its progress.",
    ),
    as_json: bool = JsonOption,
) -> None:
    """Put a failed, cancelled, stuck or finished job back to work."""
    start = _stage(from_stage, "--from") if from_stage else None
    ops = common.operations()
    collected = gc_note(ops.job(job_id))
    job = ops.requeue(job_id, from_stage=start, actor=local_actor())
    if as_json:
        _print_json(job_summary(job))
        return
    kept = len(job.progress["segments"])
    out.print(
        f"{job.job_id} requeued at {job.stage.value} (attempt {job.attempt}; "
        f"{kept}/{job.progress['segments_total']} segments kept)"
    )
    if collected:  # only --from generate (or queued) gets here after gc
        out.print(
            "its intermediates were removed by gc: every segment is regenerated, then encoded, "
            "muxed, checked and delivered; the delivery stays until the new run passes QC"
        )
    if ops.in_process:
        err.print(_NOTHING_RUNS)


@app.command()
def cancel(
    job_id: str = typer.Argument(..., metavar="JOB"),
    reason: str = typer.Option("", "--reason", help="Why; kept in the job's events."),
    as_json: bool = JsonOption,
) -> None:
    """Stop a job; its worker stops at its next checkpoint. `requeue` can continue it later."""
    job = common.operations().cancel(job_id, reason=reason, actor=local_actor())
    if as_json:
        _print_json(job_summary(job))
        return
    if job.stage is Stage.DONE:
        out.print(f"{job.job_id}: the redo was dropped; version {job.version} stays published")
        return
    out.print(
        f"{job.job_id} cancelled (was {job.stopped_stage.value if job.stopped_stage else '?'})"
    )


ReviewedAttempt = typer.Option(
    None,
    "--attempt",
    help="The attempt you reviewed (`factory status`: candidate); refused "
    "if another one is in review now.",
)
ReviewedVersion = typer.Option(
    None, "--version", help="The version you reviewed; refused if it would be delivered as another."
)


@app.command()
def approve(
    job_id: str = typer.Argument(..., metavar="JOB"),
    note: str = typer.Option("", "--note", help="Kept in the job's events."),
    attempt: int | None = ReviewedAttempt,
    version: int | None = ReviewedVersion,
    as_json: bool = JsonOption,
) -> None:
    """Publish a job that passed QC and waits for review (a batch with `review: required`):
    the workers deliver it, or this command does when there is no broker."""
    job = common.operations().approve(job_id, actor=local_actor(), note=note, attempt=attempt,
                         version=version)  # fmt: skip
    if as_json:
        _print_json(job_summary(job))
        return
    where = "delivered" if job.stage is Stage.DONE else f"approved, now {describe.stage_text(job)}"
    out.print(f"{job.job_id} {where}")
    if job.stage not in (Stage.DONE, Stage.DELIVER):
        raise typer.Exit(1)


@app.command()
def reject(
    job_id: str = typer.Argument(..., metavar="JOB"),
    reason: str = typer.Option(..., "--reason", help="Why it is sent back (required)."),
    attempt: int | None = ReviewedAttempt,
    version: int | None = ReviewedVersion,
    as_json: bool = JsonOption,
) -> None:
    """Send back a job waiting for review. A first version stops in review with the reason as
    its error (`factory requeue JOB --from STAGE` makes it again); a redo is dropped and the
    job is done again at the version it had."""
    job = common.operations().reject(job_id, actor=local_actor(), reason=reason, attempt=attempt,
                        version=version)  # fmt: skip
    if as_json:
        _print_json(job_summary(job))
        return
    if job.stage is Stage.DONE:
        out.print(f"{job.job_id}: the redo was sent back ({reason}); version {job.version} "
                  "stays published")  # fmt: skip
        return
    out.print(f"{job.job_id} sent back: {reason}")


# --- presentation ----------------------------------------------------------------------


def _stage(value: str, option: str) -> Stage:
    try:
        return Stage(value)
    except ValueError:
        raise BadInput(
            f"unknown stage {value!r}; choose one of {', '.join(STAGE_NAMES)}", field=option
        ) from None


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")


cli_schema.register(app)
cli_cluster.register(app)
cli_gpu.register(app)
cli_topology.register()
cli_qc.register(app)
cli_forecast.register(app)
cli_gc.register(app)
cli_serve.register(app)
cli_redo.register(app)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    try:
        code = app(args=args, prog_name="factory", standalone_mode=False)
    except typer.Exit as exc:
        code = exc.exit_code
    except _CommandLineError as exc:  # usage errors: exit 2 with click's own message
        exc.show()
        code = exc.exit_code
    except typer.Abort:
        err.print("aborted")
        code = 130
    except FactoryError as exc:
        if debug:
            raise
        err.print(f"error: {exc}", markup=False)
        code = exc.exit_code
    except Exception as exc:
        if debug:
            raise
        err.print(
            f"internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)",
            markup=False,
        )
        code = 1
    sys.exit(code if isinstance(code, int) else 0)
