"""`factory gc`: remove the intermediates of delivered jobs older than the retention policy
(FACTORY_KEEP_INTERMEDIATES, 7 days), with a progress bar; what goes and what stays is in
factory/ops/retention.py and docs/storage.md."""

from __future__ import annotations

import json
import sys

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from factory.cli import common
from factory.cli.common import err, out
from factory.config import parse_duration
from factory.ops.retention import JobGc, Report, human_bytes


def register(app: typer.Typer) -> None:
    app.command("gc")(gc)


def gc(
    older_than: str | None = typer.Option(
        None,
        "--older-than",
        help="Only jobs delivered longer ago than this: 7d, 36h, 90m, 0 "
        "(default FACTORY_KEEP_INTERMEDIATES, 7d).",
    ),
    batch: str | None = typer.Option(None, "--batch", help="Only this batch."),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="List what would be removed; remove and record nothing."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary for scripts."),
) -> None:
    """Remove the intermediates (lossless segments, chunks, work media) of delivered jobs;
    keep the delivery, the QC reports and pictures. Jobs not done, or not passed by QC, are
    never touched. Afterwards such a job can only be redone with `requeue --from generate`."""
    settings = common.settings()
    seconds = (
        parse_duration(older_than, "--older-than")
        if older_than is not None
        else settings.keep_intermediates
    )
    if seconds is None:
        err.print("FACTORY_KEEP_INTERMEDIATES=forever: nothing is removed (give --older-than)")
        return
    ops = common.operations(send=False)
    with GcDisplay(err) as display:
        report = ops.gc(older_than=seconds, batch=batch, dry_run=dry_run, observer=display)
    if as_json:
        sys.stdout.write(json.dumps(report.to_dict(), indent=2) + "\n")
    else:
        _print(report, settings.store_url)
    if not report.ok:
        err.print("some intermediates could not be removed; `factory gc` again retries them")
        raise typer.Exit(1)


class GcDisplay:
    """A bar over the objects to remove (bytes freed beside it) on a terminal; a line per
    job otherwise (cron)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live = console.is_terminal
        self.freed = 0
        self.progress = Progress(
            TextColumn("{task.description:<34}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("objects, {task.fields[freed]} freed"),
            TimeElapsedColumn(),
            console=console,
            disable=not self.live,
        )
        self.task = self.progress.add_task("gc", total=None, freed=human_bytes(0))

    def __enter__(self) -> GcDisplay:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def planned(self, plans: list[JobGc]) -> None:
        self.progress.update(self.task, total=sum(len(p.items) for p in plans))

    def removing(self, plan: JobGc) -> None:
        self.progress.update(self.task, description=plan.job_id)

    def removed(self, plan: JobGc, objects: int, size: int) -> None:
        self.freed += size
        self.progress.update(self.task, advance=objects, freed=human_bytes(self.freed))

    def finished(self, plan: JobGc) -> None:
        if not self.live:
            self.console.print(
                f"{plan.job_id}: {plan.state}, {plan.objects} objects, "
                f"{human_bytes(plan.bytes)} freed",
                markup=False,
            )


def _print(report: Report, store_url: str) -> None:
    table = Table("JOB", "DELIVERED", "OBJECTS", "SIZE", "WHAT", "RESULT")
    for job in report.jobs:
        items = job.items if report.dry_run else job.removed
        kinds = job.kinds(items)
        table.add_row(
            job.job_id,
            job.finished_at.strftime("%Y-%m-%d %H:%M"),
            str(len(items)),
            human_bytes(sum(i.size for i in items)),
            ", ".join(f"{k} {v['objects']}" for k, v in kinds.items()) or "-",
            "would remove" if report.dry_run else job.state,
        )
        for key, why in list(job.errors.items())[:3]:
            table.add_row("", "", "", "", f"not removed: {key}", why)
    if report.jobs:
        out.print(table)
    where = f"batch {report.batch}" if report.batch else store_url
    verb = "would free" if report.dry_run else "freed"
    out.print(
        f"{verb} {human_bytes(report.bytes)} in {report.objects} objects from "
        f"{len(report.jobs)} delivered job(s) finished before "
        f"{report.cutoff.strftime('%Y-%m-%d %H:%M')} UTC ({where})"
        + ("; dry run: nothing removed" if report.dry_run else "")
    )
    if report.kept_jobs:
        kept = ", ".join(f"{n} {why}" for why, n in report.kept_jobs.items())
        out.print(f"left alone: {kept}")
