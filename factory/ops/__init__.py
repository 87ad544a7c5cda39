"""The operations the CLI and `factory serve` share: reading batches and jobs, submitting
manifests, and the operator actions (requeue, cancel, approve, reject), each recorded in the
job's events with who did it. The rules live here once; the state machine stays the only
writer of a job's stage.

Every interface calls this and nothing below it. Where accepted work goes is injected by
each composition root as a `Dispatcher`: the CLI and `factory serve` with a broker pass
tasks.dispatch.BrokerDispatcher, `factory serve` without one its LocalRunner; with none,
work is only recorded (the embedded CLI runs it here: `in_process`, `run_here`)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select, tuple_

from factory.db.models import batches, jobs
from factory.errors import BadInput
from factory.job import Event, Job
from factory.ops import forecast as forecasting
from factory.ops import retention
from factory.ops.paging import PAST_GENERATION, decode_cursor, encode_cursor, progress_number
from factory.ops.views import (
    BatchForecast,
    BatchView,
    JobView,
    Page,
    event_dict,
    job_summary,
    shot_rows,
)
from factory.plan.redo import RedoPlan, parse_range, plan_redo, plan_rejoin
from factory.spec import MAX_PROMPT_CHARS, MAX_SEED, VideoSpec, transition_frames, with_joins
from factory.stages import Stage
from factory.store import open_store
from factory.wiring import Factory

if TYPE_CHECKING:  # manifests, preflight and submit are imported where a manifest is read
    from factory.config import Settings
    from factory.manifest import Manifest
    from factory.ops import preflight
    from factory.ops.material import MaterialRedo
    from factory.ops.submit import Submitted

Dispatcher = Callable[[list[Job]], None]
__all__ = ["BatchForecast", "BatchView", "Dispatcher", "JobView", "Operations", "Page",
           "check_manifest", "event_dict", "job_summary", "local_actor", "shot_rows"]  # fmt: skip
log = logging.getLogger("factory.ops")
HISTORY_SECONDS = 300.0  # the forecast's history is re-read at most this often
ETA_SECONDS = 30.0  # a batch's ETA is recomputed at most this often


def local_actor() -> str:
    """Who acts from a shell: the user and host (the API passes `token:NAME`)."""
    user = os.environ.get("USER") or os.environ.get("LOGNAME") or "unknown"
    return f"cli:{user}@{socket.gethostname()}"


class Operations:
    def __init__(self, factory: Factory, *, dispatcher: Dispatcher | None = None) -> None:
        self.factory = factory
        self.machine = factory.jobs
        self.settings = factory.settings
        self._dispatcher = dispatcher
        self._history: tuple[float, forecasting.History] | None = None
        self._etas: dict[tuple[str | None, int | None], tuple[float, datetime | None]] = {}
        self._history_lock = threading.Lock()

    # --- reading ---------------------------------------------------------------------

    def job(self, job_id: str) -> Job:
        return self.machine.get(job_id)

    def job_view(self, job_id: str, *, with_checks: bool = False) -> JobView:
        job = self.machine.get(job_id)
        checks = self._qc_checks(job) if with_checks else {}
        candidate = self.machine.review_candidate(job_id) if job.stage is Stage.REVIEW else None
        return JobView(job, self.machine.segments(job_id), checks,
                       self.machine.versions(job_id), candidate)  # fmt: skip

    def events(self, job_id: str) -> list[Event]:
        return self.machine.events(job_id)

    def jobs(
        self,
        *,
        batch: str | None = None,
        stage: Stage | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> Page:
        """Jobs in submission order, a page at a time (keyset: a page costs the same at job
        10,000 as at job 10)."""
        if not 1 <= limit <= 1000:
            raise BadInput(f"must be from 1 to 1000, got {limit}", field="limit")
        query = select(jobs).order_by(jobs.c.created_at, jobs.c.job_id).limit(limit + 1)
        if batch is not None:
            query = query.where(jobs.c.batch == batch)
        if stage is not None:
            query = query.where(jobs.c.stage == stage.value)
        if after:
            created, job_id = decode_cursor(after)
            query = query.where(tuple_(jobs.c.created_at, jobs.c.job_id) > (created, job_id))
        with self.machine.database.transaction() as conn:
            rows = [Job.from_row(row) for row in conn.execute(query)]
        more = len(rows) > limit
        rows = rows[:limit]
        cursor = encode_cursor(rows[-1].created_at, rows[-1].job_id) if more and rows else None
        return Page(rows, cursor)

    def batches(self, *, limit: int = 50, names: list[str] | None = None) -> list[BatchView]:
        """The newest batches (or the named ones), each with its jobs counted by stage in one
        query, and the forecast's finish for those still running."""
        query = select(batches).order_by(batches.c.created_at.desc(), batches.c.batch)
        query = query.where(batches.c.batch.in_(names)) if names is not None else query
        counts = (
            select(
                jobs.c.batch,
                jobs.c.stage,
                func.count(),
                func.sum(func.coalesce(progress_number("frame"), 0)),
                func.sum(func.coalesce(progress_number("frames_total"), 0)),
            )
            .group_by(jobs.c.batch, jobs.c.stage)
            .where(jobs.c.batch.in_(select(query.limit(limit).subquery().c.batch)))
        )
        with self.machine.database.transaction() as conn:
            found = conn.execute(query.limit(limit)).all()
            tallies: dict[str, dict[str, list[int]]] = {}
            for name, stage, n, done, total in conn.execute(counts):
                tallies.setdefault(name, {})[stage] = [int(n), int(done or 0), int(total or 0)]
        views = []
        for row in found:
            tally = tallies.get(row.batch, {})
            done_frames = sum(
                total if stage in PAST_GENERATION else done
                for stage, (_, done, total) in tally.items()
            )
            views.append(
                BatchView(
                    batch=row.batch,
                    created_at=row.created_at,
                    review=bool(row.review),
                    by_stage={stage: n for stage, (n, _, _) in tally.items()},
                    frames_done=done_frames,
                    frames_total=sum(total for _, _, total in tally.values()),
                )
            )
        return views

    def batch(self, name: str, *, with_eta: bool = True) -> BatchView:
        found = self.batches(limit=1, names=[name])
        if not found:
            raise BadInput(f"no batch named {name!r}", field="batch")
        view = found[0]
        if with_eta and not view.finished:
            view = dataclasses.replace(view, eta=self.eta(name))
        return view

    def eta(self, batch: str | None, *, gpus: int | None = None) -> datetime | None:
        """When the unfinished jobs (of `batch`, or all) should be done: what is left of each
        (forecast.time_left) scheduled on `gpus` GPUs (default FACTORY_CONSOLE_GPUS). Kept
        for ETA_SECONDS: pages ask for it often, and it moves slowly."""
        key = (batch, gpus)
        now = time.monotonic()
        with self._history_lock:
            cached = self._etas.get(key)
        if cached is not None and now - cached[0] < ETA_SECONDS:
            return cached[1]
        query = select(jobs.c.job_id, jobs.c.spec, jobs.c.progress).where(
            jobs.c.stage.in_([s.value for s in Stage if not (s.is_terminal or s.is_parked)])
        )
        if batch is not None:
            query = query.where(jobs.c.batch == batch)
        with self.machine.database.transaction() as conn:
            rows = conn.execute(query).all()
            clock = self.machine.now(conn)
        found = None
        if rows:
            # Arithmetic only: the stored spec is read without the workers' re-validation.
            left = self._seconds_left([(j, VideoSpec.from_dict(s), p) for j, s, p in rows])
            working = max(1, gpus or self.settings.console.gpus)
            found = clock + timedelta(seconds=forecasting.makespan(list(left.values()), working))
        with self._history_lock:
            self._etas[key] = (now, found)
        return found

    def time_left(self, found: list[Job]) -> dict[str, float]:
        """Seconds of work each unfinished job of `found` has left (forecast.time_left)."""
        return self._seconds_left([(j.job_id, VideoSpec.from_dict(j.spec), j.progress)
                                   for j in found
                                   if not (j.stage.is_terminal or j.stage.is_parked)])  # fmt: skip

    def published(self, job_ids: Iterable[str]) -> dict[str, dict[str, str]]:
        """The files of each delivered job's current version, by job."""
        versions = self.machine.current_versions(job_ids)
        return {job_id: version.outputs or {} for job_id, version in versions.items()}

    def all_jobs(self, batch: str | None = None) -> list[Job]:
        """Every job (of a batch), oldest first: for views that show a batch whole (the live
        page, `factory watch`); lists a person pages through use `jobs`."""
        return self.machine.list_jobs(batch=batch, limit=100_000)

    def forecast(
        self,
        parsed: Manifest,
        *,
        gpus: int,
        window: str | None = None,
        gpu_kind: str | None = None,
    ) -> BatchForecast:
        """When a manifest's batch would finish on `gpus` GPUs from recorded timings; with a
        window, whether it fits and, if not, how many GPUs would make it."""
        history = forecasting.History.load(self.factory.database)
        now = datetime.now().astimezone()
        start, end = forecasting.parse_window(window, now) if window else (now, None)
        videos = list(parsed.videos)
        result = forecasting.forecast(
            videos, history, gpus=gpus, start=start, window_end=end, gpu_kind=gpu_kind
        )
        needed = None
        if end is not None and not result.fits:
            needed = forecasting.gpus_needed(videos, history, start, end, gpu_kind)
        return BatchForecast(result, needed, len(history.samples))

    def redo_plan(
        self, job_id: str, *, range_text: str | None, cascade: bool, joins: Sequence[str] = (),
        images: Sequence[str] = (), cameras: Sequence[str] = (), remote: bool = False,
    ) -> tuple[Job, RedoPlan]:  # fmt: skip
        """What a redo of `range_text` would make again, join, encode and cost; what one that
        changes `joins` between shots (`2=dissolve:1.5`) would encode again; or what one that
        swaps scenes' `images` or `cameras` (`1=./product.png`) would make again (nothing is
        written: `factory redo --dry-run` prints it). `remote`: asked over the API."""
        _one_kind_of_redo(range_text, joins, images, cameras)
        job = self.machine.get(job_id)
        if joins:
            return job, self._rejoin_plan(job, joins)[0]
        if images or cameras:
            return job, self._material_redo(job, images, cameras, cascade, remote).plan
        assert range_text is not None
        start, end = parse_range(range_text, job.video.duration)
        return job, self._range_plan(job, start, end, cascade)

    def _range_plan(
        self, job: Job, start: float, end: float, cascade: bool,
        span: tuple[int, int] | None = None,
    ) -> RedoPlan:  # fmt: skip
        from factory.plan.chunks import chunk_keyframes, plan_chunks
        from factory.plan.video import video_plan

        video = job.video
        planned = plan_chunks(video)
        outgoing = {c.index: c.blend.outgoing if c.blend else () for c in planned}
        chunks = [(c.index, tuple(s.index for s in c.segments + outgoing[c.index]))
                  for c in planned]  # fmt: skip
        keyframes = {c.index: chunk_keyframes(video, c) for c in planned}
        seconds = {i: r.seconds for i, r in self.machine.segments(job.job_id).items()}
        # What it would be delivered as if nothing else were delivered first (taken again
        # under the job's lock when the redo starts, and when it is delivered).
        return plan_redo(video, video_plan(video), chunks, seconds, start=start, end=end,
                         cascade=cascade, version=self.machine.next_version(job.job_id),
                         keyframes=keyframes, span=span)  # fmt: skip

    def _material_redo(
        self, job: Job, images: Sequence[str], cameras: Sequence[str], cascade: bool,
        remote: bool,
    ) -> MaterialRedo:  # fmt: skip
        from factory.ops.material import plan_material_redo

        fps = job.video.fps

        def plan_range(found: Job, span: tuple[int, int], frames: tuple[int, int]) -> RedoPlan:
            return self._range_plan(found, frames[0] / fps, frames[1] / fps, cascade, span)

        return plan_material_redo(job, images, cameras, self.settings, plan_range,
                                  remote=remote)  # fmt: skip

    def _rejoin_plan(self, job: Job, texts: Sequence[str]) -> tuple[RedoPlan, dict[str, Any]]:
        """The plan of a redo that changes joins, and `progress.joins` as it will be."""
        from factory.plan.chunks import plan_chunks
        from factory.plan.rejoin import check_join_change, parse_join_change
        from factory.plan.video import video_shots

        changes = [parse_join_change(text) for text in texts]
        scenes = [c.scene for c in changes]
        if len(set(scenes)) != len(scenes):
            raise BadInput("each scene's join may be given once", field="--join")
        video = job.video
        joins = dict(job.progress.get("joins") or {})
        described = []
        starts = {shot.scenes[0]: shot.start for shot in video_shots(video)}
        for change in changes:
            was = check_join_change(video, change)  # (the scene is one that starts a shot)
            before = video.scenes[change.scene]
            frames = max(transition_frames(before, video.fps), round(change.seconds * video.fps))
            described.append({"scene": change.scene, "frame": starts[change.scene],
                              "from": was, "to": change.describe(), "frames": frames})  # fmt: skip
            joins[str(change.scene)] = change.to_dict()
        after = with_joins(job.video_as_submitted, joins)
        plan = plan_rejoin(video, plan_chunks(video), plan_chunks(after), described,
                           version=self.machine.next_version(job.job_id))  # fmt: skip
        return plan, joins

    def redo(
        self,
        job_id: str,
        *,
        range_text: str | None,
        actor: str,
        seed: int | None = None,
        new_seed: bool = False,
        prompt: str | None = None,
        reason: str = "",
        cascade: bool = False,
        joins: Sequence[str] = (),
        images: Sequence[str] = (),
        cameras: Sequence[str] = (),
        remote: bool = False,
    ) -> tuple[RedoPlan, Job]:
        """Start a redo: the plan's segments made again (new seed and/or prompt, or the
        scenes' swapped `images` / `cameras`), joined, encoded, checked and delivered as a new
        version; handed to the dispatcher, or left for the caller to run in-process when none
        is injected (`run_here`). Without a seed the range gets a new random one unless only
        its prompt or material changes (then it keeps its seeds); the job's progress.redo.seed
        says which was used. `remote`: asked over the API (no file of this host is read)."""
        if prompt is not None and not prompt.strip():
            raise BadInput("must not be empty", field="--prompt")
        if prompt is not None and len(prompt) > MAX_PROMPT_CHARS:
            raise BadInput(f"is longer than {MAX_PROMPT_CHARS} characters", field="--prompt")
        if seed is not None and not 0 <= seed <= MAX_SEED:
            raise BadInput(f"{seed} is not a seed: a whole number from 0 to {MAX_SEED} "
                           "(as in a manifest)", field="--seed")  # fmt: skip
        if seed is not None and new_seed:
            raise BadInput("give --new-seed or --seed N, not both", field="--seed")
        _one_kind_of_redo(range_text, joins, images, cameras)
        if joins:
            given = [name for name, value in (("--seed", seed is not None),
                     ("--new-seed", new_seed), ("--prompt", prompt is not None),
                     ("--cascade", cascade)) if value]  # fmt: skip
            if given:
                raise BadInput(f"a redo that changes joins makes no segment: {given[0]} has "
                               "nothing to apply to", field=given[0])  # fmt: skip
            return self._rejoin(job_id, joins, reason=reason, actor=actor)
        swaps = bool(images or cameras)
        if seed is None and (new_seed or not (prompt or swaps)):
            seed = secrets.randbits(31)  # a new look unless only the prompt or material changes
        material = None
        if swaps:
            job = self.machine.get(job_id)
            swap = self._material_redo(job, images, cameras, cascade, remote)
            if swap.uploads:
                from factory.ops import preflight

                settings = self.settings
                preflight.upload_files(swap.uploads, open_store(settings.store_url, settings.s3))
            plan, material = swap.plan, swap.material
        else:
            job, plan = self.redo_plan(job_id, range_text=range_text, cascade=cascade)
        job = self.machine.start_redo(job_id, plan=plan.to_dict(), seed=seed,
                                      prompt=prompt.strip() if prompt else None,
                                      reason=reason, actor=actor, material=material,
                                      planned_attempt=job.attempt)  # fmt: skip
        self._send([job])
        return plan, job

    def _rejoin(
        self, job_id: str, texts: Sequence[str], *, reason: str, actor: str
    ) -> tuple[RedoPlan, Job]:
        planned = self.machine.get(job_id)
        plan, joins = self._rejoin_plan(planned, texts)
        job = self.machine.start_redo(job_id, plan=plan.to_dict(), seed=None, prompt=None,
                                      reason=reason, actor=actor, joins=joins,
                                      planned_attempt=planned.attempt)  # fmt: skip
        self._send([job])
        return plan, job

    def run_here(self, job_id: str, actor: str, observer: Any = None) -> Job:
        """Run a job's remaining stages in this process (the embedded path)."""
        return next(self.run_all_here([job_id], actor=actor, observer=observer))

    def run_all_here(
        self,
        job_ids: Iterable[str],
        *,
        actor: str,
        observer: Any = None,
        stitch_strength: float | None = None,
    ) -> Iterator[Job]:
        """Run each job's remaining stages in this process, one job after another, yielding
        each as it ends; one stage context for all, so a model is loaded once."""
        from factory.pipeline.context import StageContext
        from factory.pipeline.runner import run_job

        overrides = {} if stitch_strength is None else {"stitch_strength": stitch_strength}
        ctx = StageContext.from_settings(
            self.settings, self.machine, self.factory.database, **overrides
        )
        worker = f"{socket.gethostname()}/{actor}-{os.getpid()}"
        for job_id in job_ids:
            try:
                yield run_job(ctx, job_id, worker=worker, observer=observer)
            except Exception:  # run_job records the job's own failures; this is everything else
                log.exception("run.failed", extra={"job_id": job_id})
                raise

    @property
    def in_process(self) -> bool:
        """No broker: work started here is run here."""
        return not self.settings.broker_url and self._dispatcher is None

    # --- acting ------------------------------------------------------------------------

    def submit_text(
        self, text: str, *, fmt: str, actor: str, batch: str | None = None
    ) -> Submitted:
        """A manifest sent as text (the API): checked as `factory validate` checks it; files
        beside a manifest do not exist here, so assets must already be in the store."""
        from factory.manifest import parse_manifest  # (manifests only where they are read)

        parsed = parse_manifest(text, source=f"api:{actor}", fmt=fmt, batch=batch)
        return self.submit_checked(self.check(parsed, remote=True), actor=actor)

    def check(self, parsed: Manifest, *, remote: bool = False) -> preflight.Preflight:
        """`remote`: sent over the API, so files beside the manifest are refused, not read."""
        return check_manifest(parsed, self.settings, remote=remote)

    def submit_checked(self, checked: preflight.Preflight, *, actor: str) -> Submitted:
        from factory.ops import preflight
        from factory.ops.submit import submit as submit_manifest

        if checked.uploads:
            settings = self.settings
            preflight.upload(checked, open_store(settings.store_url, settings.s3))
        result = submit_manifest(
            checked.manifest,
            self.machine,
            self.factory.tokens,
            review_required=self.settings.console.review_required,
            actor=actor,
        )
        created = set(result.created)
        self._send([j for j in result.jobs if j.job_id in created])
        return result

    def gc(
        self,
        *,
        older_than: int,
        batch: str | None = None,
        dry_run: bool = False,
        observer: retention.Observer | None = None,
    ) -> retention.Report:
        """Remove (or with `dry_run` list) the intermediates of delivered jobs older than
        `older_than` seconds (factory/ops/retention.py says what is kept)."""
        settings = self.settings
        store = open_store(settings.store_url, settings.s3, durable=settings.store_fsync)
        return retention.collect(self.machine, store, older_than=older_than, batch=batch,
                                 dry_run=dry_run, observer=observer)  # fmt: skip

    def requeue(self, job_id: str, *, from_stage: Stage | None, actor: str) -> Job:
        job = self.machine.requeue(job_id, from_stage=from_stage, actor=actor)
        self._send([job])
        return job

    def cancel(self, job_id: str, *, reason: str, actor: str) -> Job:
        return self.machine.cancel(job_id, reason=reason, actor=actor)

    def approve(
        self,
        job_id: str,
        *,
        actor: str,
        note: str = "",
        attempt: int | None = None,
        version: int | None = None,
    ) -> Job:
        """Approved: delivered by whoever runs this Operations' work: the workers (a broker),
        the embedded server's runner (`factory serve` injects it), or here and now (the CLI).
        `attempt` and `version` are what the reviewer saw (`JobView.review_candidate`); the
        decision is refused if the job in review is no longer that."""
        job = self.machine.decide(job_id, actor=actor, approved=True, text=note, attempt=attempt,
                                  version=version)  # fmt: skip
        if not self.in_process:
            self._send([job])
            return job
        return self.run_here(job.job_id, "approve")

    def reject(
        self,
        job_id: str,
        *,
        actor: str,
        reason: str,
        attempt: int | None = None,
        version: int | None = None,
    ) -> Job:
        """Sent back: a first version fails in review; a redo is dropped and the job is done
        again at the version it had."""
        job = self.machine.decide(job_id, actor=actor, approved=False, text=reason,
                                  attempt=attempt, version=version)  # fmt: skip
        return job

    # --- internals -----------------------------------------------------------------

    def _send(self, found: list[Job]) -> None:
        if not found:
            return
        if self._dispatcher is not None:
            self._dispatcher(found)

    def _seconds_left(
        self, open_jobs: list[tuple[str, VideoSpec, dict[str, Any]]]
    ) -> dict[str, float]:
        history = self._recent_history()
        cpu_rate = history.cpu_seconds_per_video_second or forecasting.CPU_SECONDS_PER_VIDEO_SECOND
        paces = self.machine.segment_seconds(job_id for job_id, _, _ in open_jobs)
        per_shape: dict[tuple[Any, ...], float] = {}
        left = {}
        for job_id, video, progress in open_jobs:
            shape = (video.model, video.width, video.height, video.segment_frames)
            if shape not in per_shape:
                per_shape[shape] = forecasting.segment_estimate(
                    history, video, video.segment_frames, None
                ).seconds
            left[job_id] = forecasting.time_left(
                video, progress, paces.get(job_id), per_shape[shape], cpu_rate
            )
        return left

    def _recent_history(self) -> forecasting.History:
        with self._history_lock:
            now = time.monotonic()
            if self._history is None or now - self._history[0] > HISTORY_SECONDS:
                self._history = (now, forecasting.History.load(self.factory.database))
            return self._history[1]

    def _qc_checks(self, job: Job) -> dict[str, list[dict[str, Any]]]:
        """Every QC check with its value, limit and why, from the job's report."""
        key = (job.progress.get("qc") or {}).get("report")
        if not key:
            return {}
        store = open_store(self.settings.store_url, self.settings.s3)
        try:
            with store.local_path(key) as path:
                document = json.loads(path.read_text())
        except (OSError, ValueError, BadInput):
            return {}
        checks = {name: r.get("checks", []) for name, r in document.get("renditions", {}).items()}
        checks["segments"] = document.get("segments", [])
        return checks


def check_manifest(
    parsed: Manifest, settings: Settings, *, remote: bool = False
) -> preflight.Preflight:
    """The one preflight (`factory validate`, submit, `factory run`, the API): every asset
    and model directory the manifest names, checked against this host and its store; needs
    no database, so validating writes nothing."""
    from factory.ops import preflight

    return preflight.check(
        parsed,
        lambda: open_store(settings.store_url, settings.s3),
        confinement=settings.confinement,
        s3=settings.s3,
        allow_local=not remote,
    )


def _one_kind_of_redo(
    range_text: str | None, joins: Sequence[str], images: Sequence[str], cameras: Sequence[str]
) -> None:
    """A redo makes a range again, changes joins between shots, or swaps scenes' pictures
    and camera moves (which names its range: the scenes'): one of them."""
    swaps = "--image" if images else "--camera" if cameras else None
    if joins and range_text:
        raise BadInput("a redo that changes joins makes no segment: give --join in a redo "
                       "of its own, without --range", field="--join")  # fmt: skip
    if swaps and joins:
        raise BadInput(f"a redo that changes joins makes no segment: give {swaps} in a redo "
                       "of its own", field="--join")  # fmt: skip
    if swaps and range_text:
        raise BadInput(f"{swaps} makes its scene's segments again, which is its range: leave "
                       "out --range", field="--range")  # fmt: skip
    if not (joins or range_text or swaps):
        raise BadInput("give the range to make again (1:10-1:20), --join, --image or --camera",
                       field="--range")  # fmt: skip
