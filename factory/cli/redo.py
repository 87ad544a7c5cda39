"""`factory redo JOB --range 1:10-1:20`: make a time range of a delivered video again and
deliver it as a new version (factory/plan/redo.py says how; docs/jobs.md, "Redo")."""

from __future__ import annotations

import json
import sys

import typer

from factory.cli import common
from factory.cli.common import err, out
from factory.cli.runview import RunDisplay
from factory.ops import Operations, job_summary, local_actor
from factory.stages import Stage


def register(app: typer.Typer) -> None:
    app.command("redo")(redo)


def redo(
    job_id: str = typer.Argument(..., metavar="JOB"),
    time_range: str | None = typer.Option(
        None, "--range", help="START-END of the video to make again: 1:10-1:20, or 70-80 (s)."
    ),
    join: list[str] = typer.Option(
        [],
        "--join",
        help="SCENE=cut or SCENE=TRANSITION:SECONDS: change how that scene's shot joins the "
        "one before (2=dissolve:1.5); nothing is generated again. Repeatable; not with --range.",
    ),
    image: list[str] = typer.Option(
        [],
        "--image",
        help="SCENE=PICTURE[,as=first-frame|reference] or SCENE=none: swap that scene's "
        "picture and make its segments again (keeping their seeds). Repeatable; not with "
        "--range.",
    ),
    camera: list[str] = typer.Option(
        [],
        "--camera",
        help="SCENE=TEMPLATE[,strength=0..1][,fit=stretch|loop] or SCENE=none: swap that "
        "scene's camera move and make its segments again. Repeatable; not with --range.",
    ),
    new_seed: bool = typer.Option(
        False,
        "--new-seed",
        help="A new random seed for the range (the default without --seed or --prompt).",
    ),
    seed: int | None = typer.Option(None, "--seed", help="This seed for the range (0 to 2^32-1)."),
    prompt: str | None = typer.Option(None, "--prompt", help="A new prompt for the range."),
    reason: str = typer.Option("", "--reason", help="Why; kept with the new version."),
    cascade: bool = typer.Option(
        False,
        "--cascade",
        help="Make every segment from the range to the end again "
        "(required where the next segment continues the previous one's latents).",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan; change nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Make the segments that cover a time range again, join them into the untouched rest,
    encode only the chunks that changed, check the whole video and deliver it as a new
    version beside the old one (which stays delivered if the new one fails QC). With
    --join: change a cut or transition between shots instead, from frames already made. With
    --image / --camera: swap a scene's picture or camera move and make that scene again."""
    ops = common.operations()
    if dry_run:
        _print_plan(ops, job_id, time_range, cascade, join, image, camera, as_json)
        return
    plan, job = ops.redo(job_id, range_text=time_range, actor=local_actor(), seed=seed,
                         new_seed=new_seed, prompt=prompt, reason=reason,
                         cascade=cascade, joins=join, images=image, cameras=camera)  # fmt: skip
    seed = job.progress["redo"]["seed"]
    if not as_json:
        for line in plan.describe(job.video.fps):
            out.print(line, markup=False)
        if seed is not None:
            out.print(f"seed      {seed}")
    if ops.in_process:
        with RunDisplay(err, [job]) as display:
            job = ops.run_here(job_id, "redo", observer=display)
    if as_json:
        sys.stdout.write(json.dumps({"plan": plan.to_dict(), "job": job_summary(job)}) + "\n")
    elif job.stage is Stage.DONE:
        out.print(f"{job_id}: version {plan.version} delivered")
    elif ops.in_process:
        error = (job.last_error or {}).get("message", "")
        err.print(f"{job_id}: the redo stopped in {job.stopped_stage or job.stage}: {error}; "
                  f"version {plan.version - 1} stays delivered. `factory status {job_id}` says "
                  f"why, `factory requeue {job_id}` continues")  # fmt: skip
    else:
        out.print(f"{job_id}: redo sent to the workers (version {plan.version})")
    if job.stage in (Stage.FAILED, Stage.CANCELLED):
        raise typer.Exit(1)


def _print_plan(
    ops: Operations, job_id: str, time_range: str | None, cascade: bool, joins: list[str],
    images: list[str], cameras: list[str], as_json: bool,
) -> None:  # fmt: skip
    """`--dry-run`: the plan, and nothing changed (a swapped file is checked, not stored)."""
    job, plan = ops.redo_plan(job_id, range_text=time_range, cascade=cascade, joins=joins,
                              images=images, cameras=cameras)  # fmt: skip
    if as_json:
        sys.stdout.write(json.dumps(plan.to_dict(), indent=2) + "\n")
        return
    for line in plan.describe(job.video.fps):
        out.print(line, markup=False)
    if job.stage is not Stage.DONE:
        err.print(f"note: {job_id} is {job.stage.value}; only a done job can be redone")
