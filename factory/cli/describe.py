"""How `factory status`, `jobs` and `events` put a job into words: the status lines, the QC
line, the next step (from the one table of actions, Job.actions) and the small formats."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from factory.job import Job
from factory.ops import JobView
from factory.ops.retention import gc_note
from factory.ops.views import material_rows
from factory.stages import Action, Stage


def status_lines(view: JobView) -> list[tuple[str, str]]:
    job, made = view.job, view.segments
    p = job.progress
    video = job.video
    held = "last held by" if job.stage.is_terminal or job.stage.is_parked else "held by"
    lines = [
        ("job", job.job_id),
        ("batch", job.batch),
        ("stage", stage_text(job)),
        (
            "video",
            f"{video.duration:g} s at {video.fps} fps, {video.width}x{video.height}, "
            f"{len(video.scenes)} scene(s), model {video.model.family}",
        ),
        (
            "progress",
            f"segments {len(p['segments'])}/{p['segments_total']}, "
            f"frame {p['frame']}/{p['frames_total']}",
        ),
        ("attempt", f"{job.attempt}" + (f" {held} {job.claimed_by}" if job.claimed_by else "")),
        ("heartbeat", ago(job.heartbeat_at) if job.heartbeat_at else "none yet"),
        ("updated", ago(job.updated_at)),
    ]
    lines += material_rows(video)
    timings = [
        f"{stage} {t['seconds']:.1f} s"
        for stage, t in p.get("timings", {}).items()
        if "seconds" in t
    ]
    if timings:
        lines.append(("timings", ", ".join(timings)))
    outputs = view.outputs
    lines.append(
        (
            "outputs",
            ", ".join(f"{k}: {v}" for k, v in outputs.items()) if outputs else "none delivered yet",
        )
    )
    lines.append(("qc", qc_text(p.get("qc"), [r.seam for r in made.values() if r.seam])))
    return lines + _versions_lines(view) + _decision_lines(view)


def _versions_lines(view: JobView) -> list[tuple[str, str]]:
    """Every delivered version, and the redo in progress."""
    job, p = view.job, view.job.progress
    lines = []
    for entry in view.versions:
        current = job.version == entry.version
        at = (entry.delivered_at or entry.reserved_at).isoformat()[:19]
        said = f"v{entry.version}{' (published)' if current else ''} at {at}"
        detail = entry.detail
        if detail.get("kind") == "redo":
            said += (f": {_redid(detail)} by {entry.actor or '?'}"
                     + (f" ({detail['reason']})" if detail.get("reason") else ""))  # fmt: skip
        elif detail.get("kind") == "redelivery":
            said += ": delivered again after a requeue"
        lines.append(("version", said))
    if redo := p.get("redo"):
        why = redo.get("reason") or "no reason given"
        lines.append(("redo", f"version {redo['version']} in progress: {_redid(redo)} "
                              f"({why})"))  # fmt: skip
    return lines


def _redid(redo: dict[str, Any]) -> str:
    """What a redo (running, or a version's record) makes again or changes, in words."""
    if not redo["segments"]:  # it changed joins between shots (factory/plan/rejoin.py)
        return "joins changed: " + ", ".join(
            f"scene {j['scene']} {j['from']} -> {j['to']}" for j in redo.get("joins", ())
        )
    start, end = redo.get("range") or (redo["start"], redo["end"])
    said = f"redo {start:g}-{end:g} s, segments {redo['segments'][0]}-{redo['segments'][-1]}"
    if swapped := redo.get("material"):  # pictures or camera moves (factory/plan/material.py)
        said += "; material changed: " + ", ".join(
            f"scene {m['scene']} {m['kind']} {m['from']} -> {m['to']}" for m in swapped
        )
    return said


def _decision_lines(view: JobView) -> list[tuple[str, str]]:
    """What is waiting on a person or went wrong, and what to do next."""
    job, p = view.job, view.job.progress
    lines = []
    if view.review_candidate:
        c = view.review_candidate
        lines.append(("candidate", f"attempt {c['attempt']}, to be delivered as version "
                                   f"{c['version']}"))  # fmt: skip
    if review := p.get("review"):
        said = review.get("reason") or review.get("note") or ""
        lines.append(
            ("review", f"{review['decision']} by {review['by']} at {review['at'][:19]}"
                       + (f": {said}" if said else ""))
        )  # fmt: skip
    if job.last_error:
        e = job.last_error
        lines.append(("error", f"{e['kind']} in {e['stage']}: {e['message']}"))
    if gc := gc_note(job):
        lines.append(("gc", gc))
    if waiting_after_interruption(job):
        i = p["interrupted"]
        at = ago(datetime.fromisoformat(i["at"]))
        lines.append(("interrupted", f"{i['reason']} ({at}, {i['count']} time(s) in {i['stage']})"))
    lines.append(("next", next_step(job)))
    lines.append(("trace", job.trace_id))
    return lines


def qc_text(qc: dict[str, Any] | None, seams: list[dict[str, Any]]) -> str:
    """One line: the verdict, each rendition's fidelity, the seams; failures after it."""
    if not qc:
        regenerated = sum(s.get("regenerations", 0) for s in seams)
        return f"not run yet ({len(seams)} seams scored, {regenerated} regenerated)"
    parts = ["passed" if qc.get("passed") else "FAILED"]
    for name, values in (qc.get("fidelity") or {}).items():
        vmaf, psnr, ssim = (values.get(k) for k in ("vmaf", "psnr_y", "ssim"))
        parts.append(
            f"{name} VMAF {'n/a' if vmaf is None else f'{vmaf:.1f}'}"
            f" PSNR-Y {'n/a' if psnr is None else f'{psnr:.1f} dB'}"
            f" SSIM {'n/a' if ssim is None else f'{ssim:.3f}'}"
        )
    if qc.get("seams") is not None:
        worst = qc.get("worst_seam_jump")
        parts.append(
            f"{qc['seams']} seams (worst jump {worst if worst is not None else '-'}, "
            f"{qc.get('regenerations', 0)} regenerated)"
        )
    text = " · ".join(parts)
    failures = qc.get("failures") or []
    if failures:
        text += "\n           " + "\n           ".join(failures[:5])
    if qc.get("report"):
        text += f"\n           report {qc['report']} (+ contact.png, quality.png)"
    return text


def next_step(job: Job) -> str:
    """What the operator can do next, from the one table of actions (Job.actions)."""
    can, j = job.actions, job.job_id
    if Action.APPROVE in can:
        return (
            f"waiting for review: `factory approve {j}` delivers it, "
            f"`factory reject {j} --reason TEXT` sends it back (or the console)"
        )
    if job.stage is Stage.DONE and Action.REDO in can:
        return (
            f"nothing; `factory redo {j} --range START-END` makes a range again, "
            f"`factory requeue {j} --from STAGE` redoes part of it"
        )
    if job.stage is Stage.DONE:
        return (
            f"nothing; `factory requeue {j} --from generate` makes it again from "
            "scratch (gc removed its intermediates)"
        )
    if job.stage is Stage.FAILED and Action.CANCEL in can:
        return (
            f"`factory requeue {j}` continues the redo; `factory cancel {j}` "
            f"drops it and keeps version {job.version} published"
        )
    if job.stage is Stage.FAILED and job.stopped_stage is Stage.REVIEW:
        return (
            f"`factory requeue {j} --from generate` makes it again (or --from another "
            f"stage); `factory requeue {j}` puts the same video up for review again"
        )
    if job.stage in (Stage.FAILED, Stage.CANCELLED):
        where = job.stopped_stage.value if job.stopped_stage else "queued"
        return (
            f"`factory requeue {j}` continues at {where} keeping its progress; "
            f"add `--from STAGE` to redo from an earlier stage"
        )
    if waiting_after_interruption(job):
        return (
            "the sweeper resumes it from this stage after FACTORY_STALE_AFTER; nothing is lost. "
            "Fix what the interruption names if it keeps coming back"
        )
    if job.stage is Stage.QUEUED and job.claimed_by is None:
        return f"waiting for a worker; `factory cancel {j}` withdraws it"
    return f"in progress; `factory cancel {j}` stops it at its next checkpoint"


def waiting_after_interruption(job: Job) -> bool:
    return (
        bool(job.progress.get("interrupted")) and not job.claimed_by and not job.stage.is_terminal
    )


def stage_text(job: Job) -> str:
    if job.stopped_stage and job.stage in (Stage.FAILED, Stage.CANCELLED):
        return f"{job.stage.value} (in {job.stopped_stage.value})"
    return job.stage.value


def ago(moment: datetime | None) -> str:
    if moment is None:
        return "-"
    seconds = max(0, int((datetime.now(UTC) - moment).total_seconds()))
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    return f"{seconds // 3600} h ago"


def iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def short(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
