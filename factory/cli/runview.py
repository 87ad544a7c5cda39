"""What `factory run` shows: a bar per job and one for the batch (with ETA), or plain log lines
when the output is not a terminal (cron, CI), then a summary table."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from factory.job import Job
from factory.stages import Stage

# A job's work in bar units: one per segment, plus one for each stage after generation.
POST_STAGES = (Stage.ENCODE, Stage.MUX, Stage.QC, Stage.DELIVER)


def units(job: Job) -> int:
    return job.progress["segments_total"] + len(POST_STAGES)


def units_done(job: Job) -> int:
    done = len(job.progress["segments"])
    if job.stage in POST_STAGES:
        done += POST_STAGES.index(job.stage)
    elif job.stage is Stage.DONE:
        done += len(POST_STAGES)
    return done


class RunDisplay:
    def __init__(self, console: Console, jobs: list[Job]) -> None:
        self.console = console
        self.live = console.is_terminal
        self.started = time.monotonic()
        self.progress = Progress(
            TextColumn("{task.description:<34}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stage]:<9}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
            disable=not self.live,
        )
        self.batch = self.progress.add_task("batch", total=sum(units(j) for j in jobs), stage="",
                                            completed=sum(units_done(j) for j in jobs))  # fmt: skip
        self.tasks: dict[str, TaskID] = {
            j.job_id: self.progress.add_task(
                j.job_id, total=units(j), completed=units_done(j), stage=j.stage.value
            )
            for j in jobs
        }
        self._done_units = {j.job_id: units_done(j) for j in jobs}
        self._logged_stage: dict[str, Stage] = {}

    def __enter__(self) -> RunDisplay:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def segment_done(self, job: Job, index: int) -> None:
        self._update(job)
        total = job.progress["segments_total"]
        done = len(job.progress["segments"])
        if not self.live and (done == total or done % max(1, total // 5) == 0):
            self._log(f"{job.job_id}: segment {done}/{total}")

    def stage_changed(self, job: Job) -> None:
        self._update(job)
        if not self.live and self._logged_stage.get(job.job_id) is not job.stage:
            self._logged_stage[job.job_id] = job.stage
            self._log(f"{job.job_id}: {job.stage.value}")

    def _update(self, job: Job) -> None:
        done = units_done(job)
        delta = done - self._done_units[job.job_id]
        self._done_units[job.job_id] = done
        self.progress.update(self.tasks[job.job_id], completed=done, stage=job.stage.value)
        self.progress.advance(self.batch, delta)

    def _log(self, text: str) -> None:
        elapsed = time.monotonic() - self.started
        self.console.print(f"[{elapsed:7.1f} s] {text}", markup=False, highlight=False)


def summary_table(
    jobs: list[Job], seconds: dict[str, float], outputs: dict[str, dict[str, str]]
) -> Table:
    """`outputs`: each delivered job's published files by name."""
    table = Table("JOB", "RESULT", "SEGMENTS", "TIME", "OUTPUTS / ERROR")
    for job in jobs:
        p = job.progress
        if job.stage is Stage.DONE:
            detail = ", ".join(sorted(outputs.get(job.job_id, {})))
            result = "[green]done[/green]"
        elif job.stage is Stage.REVIEW:
            detail = f"QC passed; `factory approve {job.job_id}` or the console delivers it"
            result = "[yellow]review[/yellow]"
        else:
            error = job.last_error or {}
            where = job.stopped_stage.value if job.stopped_stage else job.stage.value
            detail = f"{where}: {error.get('message', '')}"[:120]
            result = f"[red]{job.stage.value}[/red]"
        table.add_row(job.job_id, result, f"{len(p['segments'])}/{p['segments_total']}",
                      f"{seconds.get(job.job_id, 0):.1f} s", detail)  # fmt: skip
    return table
