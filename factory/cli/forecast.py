"""`factory forecast MANIFEST`: will the batch fit its window, from recorded segment timings."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import typer
from rich.table import Table

from factory.cli import common
from factory.cli.common import out
from factory.ops.forecast import Forecast

EXIT_DOES_NOT_FIT = 3


def register(app: typer.Typer) -> None:
    app.command("forecast")(forecast_command)


def forecast_command(
    manifest: Path = typer.Argument(..., help="The batch's manifest."),
    gpus: int = typer.Option(1, "--gpus", min=1, help="GPU workers that will run the batch."),
    window: str | None = typer.Option(
        None, "--window", help="The night's window, HH:MM-HH:MM (local time), e.g. 22:00-06:00."
    ),
    gpu_kind: str | None = typer.Option(
        None, "--gpu-kind", help="Use only timings recorded on GPUs whose name contains this."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of text."),
) -> None:
    """When the batch will finish on N GPUs, per video and overall; with --window, whether it
    fits (exit 3 if not) and how many GPUs would make it fit."""
    from factory.manifest import load_manifest
    from factory.ops import Operations

    parsed = load_manifest(manifest)
    ops = Operations(common.open_factory())
    made = ops.forecast(parsed, gpus=gpus, window=window, gpu_kind=gpu_kind)
    result, needed = made.forecast, made.gpus_needed
    if as_json:
        data = result.to_dict() | {"gpus_needed": needed, "history_segments": made.recorded}
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        _print(result, needed, made.recorded)
    if result.fits is False:
        raise typer.Exit(EXIT_DOES_NOT_FIT)


def _print(result: Forecast, needed: int | None, recorded: int) -> None:
    table = Table("JOB", "SEGMENTS", "S/SEGMENT", "GPU TIME", "GPU", "DONE BY", "FROM")
    for video in sorted(result.videos, key=lambda v: v.ends_at):
        done = result.start + timedelta(seconds=video.ends_at)
        table.add_row(
            video.job_id,
            str(video.segments),
            f"{video.seconds_per_segment:.1f}",
            _duration(video.gpu_seconds),
            str(video.gpu),
            done.strftime("%a %H:%M"),
            video.basis,
        )
    out.print(table)
    out.print(
        f"{len(result.videos)} videos, {result.gpu_hours:.2f} GPU-hours on {result.gpus} GPU(s) "
        f"({recorded} recorded segments); CPU stages {result.cpu_basis}"
    )
    finish = result.finish.strftime("%a %H:%M")
    started = result.start.strftime("%a %H:%M")
    if result.window_end is None:
        out.print(f"starting {started}, the batch ends about {finish}")
        return
    margin = result.margin or 0.0
    ends = result.window_end.strftime("%a %H:%M")
    if result.fits:
        out.print(f"fits: from {started} it ends about {finish}, {_duration(margin)} before "
                  f"the window closes at {ends}")  # fmt: skip
    else:
        longest = max(result.videos, key=lambda v: v.gpu_seconds + v.cpu_seconds)
        advice = (
            f"{needed} GPUs would make it fit"
            if needed
            else f"no number of GPUs helps: {longest.job_id} alone takes "
            f"{_duration(longest.gpu_seconds + longest.cpu_seconds)} (its segments run one "
            "after another); shorten it, or start earlier"
        )
        out.print(f"does NOT fit: from {started} it ends about {finish}, {_duration(-margin)} "
                  f"after the window closes at {ends}; {advice}")  # fmt: skip


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
