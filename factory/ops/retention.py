"""Retention of intermediates (`factory gc`): what a delivered job no longer needs goes.

A delivered video keeps, per job, gigabytes of intermediates: the lossless segments and their
tails, the encoded chunks, the joined videos, the audio and the muxed renditions. Once a job
has been `done` (delivered, QC passed) for longer than the policy (FACTORY_KEEP_INTERMEDIATES,
7 days, or ``--older-than``), gc removes them and keeps what people review, which is small:

    removed   segments/*.mkv, segments/*.tail.npy       (lossless segments, their tails)
              segments/*.carry.safetensors              (latents a next segment continued)
              chunks/**                                 (encoded chunks)
              work/**.video.mp4, work/**.m4a, work/**.mp4  (joined videos, audio, muxed)
    kept      out/*  qc.json  contact.png  quality.png  (the delivery)
              work/**/qc.json  work/**/*.png            (QC reports and pictures per attempt)
              segments/*.thumbs.png                     (seam thumbnails)
              anything else

Jobs that are not done (queued, running, failed, cancelled) and done jobs whose QC did not
pass are never touched. Safe against a requeue racing it: before deleting anything gc marks
the job (``progress.gc``) through the state machine, fenced on the attempt it listed, which
refuses ``requeue --from`` any stage after generate from then on; before each batch of deletes
it checks that the job is still done at that attempt, and stops (keeping what is left) if it
was requeued. The end is recorded as a ``gc`` event with the objects, bytes and kinds removed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import select

from factory.db.models import jobs as jobs_table
from factory.db.state import JobStateMachine
from factory.errors import FactoryError, StaleAttempt
from factory.job import Job
from factory.stages import Stage
from factory.store import Store, keys

DELETE_BATCH = 1000  # keys per delete_many call (S3's DeleteObjects takes at most 1000)
KINDS = ("segment", "tail", "carry", "chunk", "joined", "audio", "muxed")


def classify(job_prefix: str, key: str) -> str | None:
    """The kind of intermediate ``key`` is, or None for a file gc keeps."""
    if not key.startswith(job_prefix + "/"):
        return None
    parts = key[len(job_prefix) + 1 :].split("/")
    top, name = parts[0], parts[-1]
    if top == "segments" and len(parts) == 2:
        if name.endswith(".tail.npy"):
            return "tail"
        if name.endswith(".carry.safetensors"):
            return "carry"
        return "segment" if name.endswith(".mkv") else None
    if top == "chunks" and len(parts) > 1:
        return "chunk"
    if top == "work" and len(parts) > 1:
        if name.endswith(".video.mp4"):
            return "joined"
        if name.endswith(".m4a"):
            return "audio"
        return "muxed" if name.endswith(".mp4") else None
    return None


@dataclass(frozen=True)
class Item:
    key: str
    size: int
    kind: str


@dataclass
class JobGc:
    """One job: what gc would remove (planned), what it removed, and how it ended."""

    job_id: str
    attempt: int
    finished_at: datetime
    items: list[Item]
    kept: int  # objects under the job's prefix that stay
    state: str = "planned"  # planned | removed | partial | requeued
    removed: list[Item] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def objects(self) -> int:
        return len(self.removed)

    @property
    def bytes(self) -> int:
        return sum(i.size for i in self.removed)

    @property
    def planned_bytes(self) -> int:
        return sum(i.size for i in self.items)

    def kinds(self, items: list[Item]) -> dict[str, dict[str, int]]:
        count, size = Counter(i.kind for i in items), Counter()
        for item in items:
            size[item.kind] += item.size
        return {k: {"objects": count[k], "bytes": size[k]} for k in KINDS if count[k]}

    def to_dict(self, dry_run: bool) -> dict[str, Any]:
        items = self.items if dry_run else self.removed
        return {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "finished_at": self.finished_at.isoformat(),
            "state": self.state,
            "objects": len(items),
            "bytes": sum(i.size for i in items),
            "kinds": self.kinds(items),
            "kept_objects": self.kept + len(self.items) - len(items),
            "keys": [i.key for i in items],
            "errors": self.errors,
        }


@dataclass
class Report:
    older_than: int
    cutoff: datetime
    batch: str | None
    dry_run: bool
    jobs: list[JobGc]
    kept_jobs: dict[str, int]  # why other jobs were left alone -> how many

    @property
    def objects(self) -> int:
        return sum(len(j.items) if self.dry_run else j.objects for j in self.jobs)

    @property
    def bytes(self) -> int:
        return sum(j.planned_bytes if self.dry_run else j.bytes for j in self.jobs)

    @property
    def ok(self) -> bool:
        return all(j.state != "partial" for j in self.jobs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "batch": self.batch,
            "older_than_seconds": self.older_than,
            "cutoff": self.cutoff.isoformat(),
            "jobs": len(self.jobs),
            "objects": self.objects,
            "bytes": self.bytes,
            "kept_jobs": self.kept_jobs,
            "per_job": [j.to_dict(self.dry_run) for j in self.jobs],
        }


class Observer(Protocol):
    def planned(self, plans: list[JobGc]) -> None: ...

    def removing(self, plan: JobGc) -> None: ...  # marked, nothing deleted yet

    def removed(self, plan: JobGc, objects: int, size: int) -> None: ...

    def finished(self, plan: JobGc) -> None: ...


# --- which jobs -----------------------------------------------------------------------


def select_jobs(
    machine: JobStateMachine, *, cutoff: datetime, batch: str | None = None
) -> tuple[list[tuple[Job, datetime]], dict[str, int]]:
    """Done jobs with QC passed, finished before ``cutoff``, not collected yet (oldest first),
    and the count of the others by why they stay. Reads only small columns of every job."""
    p = jobs_table.c.progress
    query = select(
        jobs_table.c.job_id,
        jobs_table.c.stage,
        jobs_table.c.attempt,
        jobs_table.c.updated_at,
        p["gc"],
        p[("timings", "deliver")],
        p[("qc", "passed")],
    )
    if batch is not None:
        query = query.where(jobs_table.c.batch == batch)
    with machine.database.transaction() as conn:
        rows = conn.execute(query).all()
    kept: Counter[str] = Counter()
    chosen: dict[str, datetime] = {}
    for job_id, stage, attempt, updated_at, gc, deliver, passed in rows:
        if stage != Stage.DONE.value:
            kept[f"not done ({stage})"] += 1
        elif not passed:  # a done job passed QC; without that record it stays
            kept["QC not passed"] += 1
        elif gc and gc.get("state") == "removed" and gc.get("attempt") == attempt:
            kept["already collected"] += 1
        elif (finished := _finished_at(deliver, updated_at)) > cutoff:
            kept["delivered too recently"] += 1
        else:
            chosen[job_id] = finished
    found = machine.find(chosen)
    ordered = sorted(chosen.items(), key=lambda kv: (kv[1], kv[0]))
    return [(found[j], at) for j, at in ordered if j in found], dict(sorted(kept.items()))


def _finished_at(deliver: dict[str, Any] | None, updated_at: datetime) -> datetime:
    """When the deliver stage ended (its recorded start and seconds, by the database's
    clock); the row's last change for a job without that record."""
    try:
        started = datetime.fromisoformat(deliver["started_at"])  # type: ignore[index]
        return (started + timedelta(seconds=float(deliver["seconds"]))).astimezone(UTC)  # type: ignore[index]
    except (TypeError, KeyError, ValueError):
        return updated_at


# --- what goes ------------------------------------------------------------------------


def plan_job(store: Store, job: Job, finished_at: datetime) -> JobGc:
    prefix = keys.job_prefix(job.batch, job.video_id)
    items, kept = [], 0
    for key, size in store.list_sizes(prefix):
        kind = classify(prefix, key)
        if kind is None:
            kept += 1
        else:
            items.append(Item(key, size, kind))
    return JobGc(job.job_id, job.attempt, finished_at, items, kept)


def collect(
    machine: JobStateMachine,
    store: Store,
    *,
    older_than: int,
    batch: str | None = None,
    dry_run: bool = False,
    observer: Observer | None = None,
) -> Report:
    """Remove (or, with ``dry_run``, only list) the intermediates of every delivered job
    finished more than ``older_than`` seconds ago."""
    cutoff = machine.current_time() - timedelta(seconds=older_than)
    selected, kept_jobs = select_jobs(machine, cutoff=cutoff, batch=batch)
    plans = [plan_job(store, job, finished) for job, finished in selected]
    report = Report(older_than, cutoff, batch, dry_run, plans, kept_jobs)
    if observer:
        observer.planned(plans)
    if dry_run:
        return report
    for plan in plans:
        _remove(machine, store, plan, observer)
        if observer:
            observer.finished(plan)
    return report


def _remove(machine: JobStateMachine, store: Store, plan: JobGc, observer: Observer | None) -> None:
    try:  # from here on a requeue --from a stage after generate is refused
        marked = machine.mark_gc(plan.job_id, attempt=plan.attempt, gc={"state": "removing"})
    except StaleAttempt:
        plan.state = "requeued"
        return
    started_at = marked.progress["gc"]["at"]
    if observer:
        observer.removing(plan)
    try:
        for batch in _batches(plan.items):
            if not _still_done(machine, plan):
                plan.state = "requeued"  # its files are the new run's business now
                return
            failed = store.delete_many([i.key for i in batch])
            plan.errors.update(failed)
            gone = [i for i in batch if i.key not in failed]
            plan.removed += gone
            if observer:
                observer.removed(plan, len(gone), sum(i.size for i in gone))
    except FactoryError as exc:  # the store went away after its own retries
        plan.errors["*"] = str(exc)
    plan.state = "partial" if plan.errors else "removed"
    summary = {
        "objects": plan.objects,
        "bytes": plan.bytes,
        "kinds": plan.kinds(plan.removed),
        "errors": len(plan.errors),
    }
    detail = {**summary, "first_errors": dict(list(plan.errors.items())[:5])}
    try:
        machine.mark_gc(
            plan.job_id,
            attempt=plan.attempt,
            gc={"state": plan.state, "started_at": started_at, **summary},
            event="gc",
            detail=detail,
        )
    except StaleAttempt:
        plan.state = "requeued"


def _still_done(machine: JobStateMachine, plan: JobGc) -> bool:
    job = machine.get(plan.job_id)
    return job.stage is Stage.DONE and job.attempt == plan.attempt


def _batches(items: list[Item]) -> Iterator[list[Item]]:
    for start in range(0, len(items), DELETE_BATCH):
        yield items[start : start + DELETE_BATCH]


# --- what people read -------------------------------------------------------------------


def human_bytes(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def gc_note(job: Job) -> str | None:
    """What `factory status` says of a job gc has been at (None: it has not)."""
    gc = job.progress.get("gc")
    if not gc:
        return None
    when = _when(gc.get("at"))
    size = f"{gc.get('objects', 0)} objects, {human_bytes(gc.get('bytes', 0))}"
    after = (
        f"a requeue must start from generate: all {job.progress.get('segments_total', '?')} "
        "segments are regenerated, then encoded, "
        "muxed, checked and delivered again (--from a later stage is refused)"
    )
    state = gc.get("state")
    if state == "removed":
        return f"intermediates removed by gc on {when} ({size}); {after}"
    if state == "partial":
        return (
            f"gc removed part of the intermediates on {when} ({size}; {gc.get('errors', 0)} "
            f"could not be removed: `factory gc` again finishes it); {after}"
        )
    return (
        f"gc started removing the intermediates on {when} and did not finish "
        f"(`factory gc` again finishes it); {after}"
    )


def _when(iso: str | None) -> str:
    if not iso:
        return "?"
    return datetime.fromisoformat(iso).astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
