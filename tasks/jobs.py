"""The tasks: transport. Each takes ids, claims the job with its fencing token, runs one step
of the stage engine (factory/pipeline/engine.py: the stage table, the heartbeat, how work
ends), and sends the next message. PostgreSQL is the record of what comes next; the sweeper
re-sends anything a lost message or a dead worker dropped."""

from __future__ import annotations

import contextlib
import logging
import time

from celery.exceptions import SoftTimeLimitExceeded
from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

from factory.errors import IllegalTransition, RetryableError, StaleAttempt
from factory.job import Job
from factory.pipeline import engine
from factory.pipeline.chunk_qc import measure_chunk
from factory.pipeline.chunks import chunk_ready
from factory.pipeline.claims import Claim, Unclaimed
from factory.pipeline.encode import ensure_chunk
from factory.pipeline.files import Segments
from factory.pipeline.generate import generate_segment as make_segment
from factory.plan.chunks import plan_chunks
from factory.plan.video import (
    next_segment,
    open_shots,
    segments_made,
    video_plan,
    video_shots,
)
from factory.stages import Stage, order
from tasks import (
    broker,
    dispatch,
    health,  # noqa: F401 - the health endpoint, once the worker is ready
    signals,  # noqa: F401 - connects the worker signal handlers
)
from tasks.celery_app import app
from tasks.queues import ALIVE_PREFIX, GPU_SHARED
from tasks.runtime import Runtime, runtime

log = logging.getLogger("factory.tasks")

# The work stops here and the sweeper resumes the job later: infrastructure, not the job.
INTERRUPTIONS = (RetryableError, SoftTimeLimitExceeded, OperationalError, RedisError)


@app.task(name="factory.generate_segment", acks_late=False)
def generate_segment(job_id: str, seen_attempt: int) -> None:
    """Segments of one job, each stored and recorded before the next, for up to
    FACTORY_GPU_TASK_SECONDS; then the next one onto this GPU's own queue. (A task per
    segment would cost a broker round trip and a claim each: a third of the segment path
    with real-time-class models.) A crash still costs at most the segment in progress."""
    rt = runtime()
    try:
        job = rt.machine.claim(job_id, seen_attempt=seen_attempt, worker=rt.worker)
    except StaleAttempt as exc:  # a duplicate or superseded message: nothing to do
        log.info("segment.skipped", extra={"job_id": job_id, "reason": exc.reason})
        _dropped(job_id, "generate", seen_attempt, exc.reason)
        return
    if job.stage not in (Stage.QUEUED, Stage.GENERATE):
        dispatch.dispatch(app, job)
        return
    with _settles(job_id, job.attempt, "segment"):
        if job.stage is Stage.QUEUED:
            job = rt.machine.transition(job_id, attempt=job.attempt, to=Stage.GENERATE)
        if len(video_shots(job.video)) > 1:
            # A video told in shots: every other open shot offered to the GPUs at once.
            for _ in open_shots(job)[1:]:
                dispatch.send_shot(app, job)
            _make_shots(rt, job)
            return
        started, longest = time.monotonic(), 0.0
        with _heartbeat(rt, job):
            while True:
                began, before = time.monotonic(), job
                job, rt.warm = make_segment(rt.ctx, job, rt.warm)
                longest = max(longest, time.monotonic() - began)
                made = segments_made(before, job)
                log.info("segment.done", extra={"segments": sorted(made), "attempt": job.attempt})
                _send_ready_chunks(job, made)
                if next_segment(job) is None or not _own_queue_alive(rt):
                    break
                if not _time_for_another(rt, time.monotonic() - started, longest):
                    break
        if next_segment(job) is None:
            job = rt.machine.transition(job_id, attempt=job.attempt, to=Stage.ENCODE)
            dispatch.send_cpu_chain(app, job)
        elif _own_queue_alive(rt):
            dispatch.send_segment(app, job, queue=rt.own_queue)
        else:  # shutting down, or no own queue: hand the job back to every GPU at once
            job = rt.machine.release(job_id, attempt=job.attempt, reason="worker leaving")
            dispatch.send_segment(app, job, queue=GPU_SHARED)


@app.task(name="factory.generate_shot", acks_late=False)
def generate_shot(job_id: str, attempt: int, shot: int | None = None) -> None:
    """One more GPU on a video told in shots (docs/pipeline.md, "Shots in parallel"): joins
    the job's generation under the attempt that holds it, takes a shot no one holds (`shot`
    first, when given: its own continuation) and makes its segments; then another, while
    any is open."""
    rt = runtime()
    try:
        job = rt.machine.join(job_id, attempt=attempt, worker=rt.worker, shot=shot)
    except StaleAttempt as exc:  # finished, requeued, cancelled or recovered since
        log.info("shot.skipped", extra={"job_id": job_id, "reason": exc.reason})
        return
    with _settles(job_id, job.attempt, "shot"):
        _make_shots(rt, job, prefer=shot)


def _settles(job_id: str, attempt: int, what: str) -> contextlib.AbstractContextManager:
    """How a task's work ends when it does not finish (the engine's rule): fenced out,
    interrupted (handed back for the sweeper: `_interrupt`), or failed."""
    return engine.settles(runtime().machine, job_id, attempt, what=what,
                          interruptions=INTERRUPTIONS,
                          interrupt=lambda exc: _interrupt(job_id, attempt, exc),
                          reraise_internal=True)  # fmt: skip


def _make_shots(rt: Runtime, job: Job, prefer: int | None = None) -> None:
    """While a shot is open and no one holds it: hold it (a lease in Redis, renewed while the
    holder lives, gone 30 s after it dies) and make its segments, each stored and recorded
    before the next, fenced by the shared attempt and checked against the lease right
    before anything is stored. A GPU finishes the shot it holds before it takes another.
    The holder that finds every segment made moves the job on to `encode`."""
    started, longest = time.monotonic(), 0.0
    with _heartbeat(rt, job):
        while True:
            job = rt.machine.get(job.job_id)
            if job.stage is not Stage.GENERATE:
                return
            held = False
            for shot in sorted(open_shots(job), key=lambda k: (k != prefer, k)):
                with rt.claims.hold(engine.shot_lease(job, shot)) as lease:
                    if lease is None or isinstance(lease, Unclaimed):
                        continue  # another holder's, or Redis cannot say: never two holders
                    held = True
                    job = rt.machine.take_shot(job.job_id, attempt=job.attempt, shot=shot,
                                               holder=lease.holder, worker=rt.worker)  # fmt: skip
                    job, longest, more = _make_shot(rt, job, shot, lease, started, longest)
                    if not more:  # out of time, or this worker is leaving: hand it on
                        queue = rt.own_queue if _own_queue_alive(rt) else GPU_SHARED
                        dispatch.send_shot(app, job, shot=shot, queue=queue)
                        return
                break
            if not held:
                break
    if next_segment(job) is None:
        try:
            job = rt.machine.transition(job.job_id, attempt=job.attempt, to=Stage.ENCODE)
        except IllegalTransition:
            return  # the holder of another shot was first
        dispatch.send_cpu_chain(app, job)


def _make_shot(
    rt: Runtime, job: Job, shot: int, lease: Claim, started: float, longest: float
) -> tuple[Job, float, bool]:
    """The shot's segments, until it is made (True) or this task's time is up or its worker
    leaving (False: the caller hands the shot on)."""
    while next_segment(job, shot) is not None:
        if not _time_for_another(rt, time.monotonic() - started, longest) or not (
            _own_queue_alive(rt) or rt.own_queue is None
        ):
            return job, longest, False
        began, before = time.monotonic(), job
        job, rt.warm = make_segment(rt.ctx, job, rt.warm, shot=shot, keep=lease.held,
                                    holder=lease.holder)  # fmt: skip
        longest = max(longest, time.monotonic() - began)
        mine = {p.index for p in video_plan(job.video) if p.shot == shot}
        made = segments_made(before, job) & mine  # not what other holders recorded meanwhile
        log.info("segment.done", extra={"segments": sorted(made), "attempt": job.attempt,
                                        "shot": shot})  # fmt: skip
        _send_ready_chunks(job, made)
    return job, longest, True


def _send_ready_chunks(job: Job, made: set[int]) -> None:
    for chunk in plan_chunks(job.video):  # the chunks this segment completed
        if {s.index for s in chunk.made_of} & made and chunk_ready(job, chunk):
            dispatch.send_chunk(app, job, chunk.index)


@app.task(name="factory.cpu_stage", bind=True, acks_late=False)
def cpu_stage(self, job_id: str, stage_name: str, attempt: int | None = None) -> None:
    """One link of encode → mux → qc → deliver; stops the chain if the job is elsewhere.

    ``attempt`` is the link's fencing token (tasks.dispatch): a link whose token is not the
    job's attempt is a stale duplicate and is dropped, with an event, without touching the
    job. (Links sent before tokens existed carry none and claim what they find.)"""
    rt = runtime()
    stage = Stage(stage_name)
    job = rt.machine.get(job_id)
    if attempt is not None and job.attempt != attempt:
        self.request.chain = None
        reason = f"the job is at attempt {job.attempt} in {job.stage.value}"
        log.info("stage.dropped", extra={"job_id": job_id, "stage": stage_name, "reason": reason})
        _dropped(job_id, stage_name, attempt, reason)
        return
    if job.stage is not stage:
        behind = not job.stage.is_terminal and order(job.stage) < order(stage)
        if behind or job.stage.is_terminal:
            self.request.chain = None  # the job is not ready for this link, or is finished
        log.info(
            "stage.skipped", extra={"job_id": job_id, "stage": stage_name, "at": job.stage.value}
        )
        return
    try:
        job = rt.machine.claim(job_id, seen_attempt=job.attempt, worker=rt.worker)
    except StaleAttempt as exc:
        self.request.chain = None
        log.info("stage.stopped", extra={"job_id": job_id, "reason": exc.reason})
        return
    try:
        with _settles(job_id, job.attempt, "stage") as ending, engine.heartbeat(rt.ctx, job):
            engine.stage_step(rt.ctx, job, claims=rt.claims)
    finally:
        if ending.how is not None:
            self.request.chain = None  # the chain goes no further than where the job stopped


@app.task(name="factory.encode_chunk", acks_late=False)
def encode_chunk(job_id: str, chunk_index: int) -> None:
    """Encode and measure a chunk whose segments exist, ahead of the encode and qc stages;
    writes only the store."""
    rt = runtime()
    job = rt.machine.get(job_id)
    if job.stage.is_terminal:
        return
    chunk = plan_chunks(job.video)[chunk_index]
    if not chunk_ready(job, chunk):  # redone since it was sent: a later message will come
        return
    made = Segments.load(rt.machine, job)
    for rendition in job.video.renditions:  # once: the encode stage may be at it too (claims)
        ensure_chunk(rt.ctx, made, chunk, rendition, rt.claims)
    measure_chunk(rt.ctx, made, chunk)  # the quality gate's per-chunk half, off the tail


@app.task(name="factory.sweep", acks_late=False)
def sweep() -> dict[str, list[str]]:
    """Resume every job that went quiet: from its recorded stage and segment."""
    rt = runtime()
    claimed, failed = rt.machine.claim_stale(
        stale_after=rt.settings.stale_after,
        waiting=lambda: broker.waiting_messages(rt.settings.broker_url or ""),
        max_recoveries=rt.settings.max_recoveries,
        worker=f"{rt.worker}{engine.SWEEPER}",
    )
    for job in claimed:
        log.warning("sweep.resumed", extra={"job_id": job.job_id, "stage": job.stage.value})
        dispatch.dispatch(app, job)
    for job in failed:
        log.error("sweep.gave_up", extra={"job_id": job.job_id})
    offered = _offer_open_shots(rt, recovered={j.job_id for j in claimed})
    return {"resumed": [j.job_id for j in claimed], "failed": [j.job_id for j in failed],
            "offered": offered}  # fmt: skip


def _offer_open_shots(rt: Runtime, recovered: set[str]) -> list[str]:
    """One `generate_shot` message for each shot the engine says to offer."""
    offered = []
    for job, shot in engine.shots_to_offer(rt.machine, rt.claims, lambda: _waiting_shots(rt),
                                           recovered=recovered,
                                           lease_seconds=rt.settings.lease_seconds,
                                           sweep_seconds=rt.settings.sweep_every):  # fmt: skip
        dispatch.send_shot(app, job, shot=shot)
        offered.append(f"{job.job_id}#{shot}")
        log.info("sweep.offered_shot", extra={"job_id": job.job_id, "shot": shot})
    return offered


def _waiting_shots(rt: Runtime) -> dict[tuple[str, int], list[int | None]]:
    url = rt.settings.broker_url or ""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        return {}
    return broker.waiting_shots(url)


def _time_for_another(rt: Runtime, elapsed: float, longest: float) -> bool:
    """Whether this task makes the job's next segment too: within FACTORY_GPU_TASK_SECONDS,
    and far from the task's time limit at the pace seen so far."""
    budget = rt.settings.gpu_task_seconds
    return elapsed + longest <= budget and elapsed + 2 * longest <= rt.settings.segment_time_limit


def _own_queue_alive(rt: Runtime) -> bool:
    if not rt.own_queue:
        return False
    return bool(rt.broker.exists(ALIVE_PREFIX + rt.own_queue))


def _heartbeat(rt: Runtime, job: Job) -> contextlib.AbstractContextManager:
    return engine.heartbeat(rt.ctx, job)


def _dropped(job_id: str, stage: str, attempt: int, reason: str) -> None:
    """A message that could not take the job, on its timeline."""
    try:
        runtime().machine.note(
            job_id, "message.dropped", {"stage": stage, "attempt": attempt, "reason": reason}
        )
    except Exception as problem:  # the event is for people; the drop stands without it
        log.warning("job.drop_not_recorded", extra={"job_id": job_id, "error": str(problem)})


def _advice(exc: Exception) -> str:
    settings = runtime().settings
    if isinstance(exc, SoftTimeLimitExceeded):
        return (
            f"each try ran past FACTORY_SEGMENT_TIME_LIMIT ({settings.segment_time_limit} s, "
            "a cold model load included): raise it or make the segments shorter"
        )
    if isinstance(exc, (OperationalError, RedisError)):
        return "the broker kept failing: check FACTORY_BROKER_URL and Redis"
    return "fix the cause named above, then `factory requeue` continues where it stopped"


def _interrupt(job_id: str, attempt: int, exc: Exception) -> None:
    """Hand the job back with the reason; the sweeper resumes it. Past FACTORY_GIVE_UP_AFTER
    of interruptions without progress the job fails instead, and the failure is alerted. If
    the database is what is down, the job is left claimed and the sweeper recovers it."""
    rt = runtime()
    try:
        job = rt.machine.interrupt(
            job_id,
            attempt=attempt,
            reason=str(exc) or type(exc).__name__,
            kind=type(exc).__name__,
            give_up_after=rt.settings.give_up_after,
            advice=_advice(exc),
        )
    except StaleAttempt:
        return
    except Exception as problem:
        log.warning("job.interrupt_not_recorded", extra={"job_id": job_id, "error": str(problem)})
        return
    if job.stage is Stage.FAILED:
        message = (job.last_error or {}).get("message", "")
        log.error("job.failed", extra={"job_id": job_id, "kind": "NoProgress", "error": message})
