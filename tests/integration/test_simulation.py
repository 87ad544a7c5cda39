"""A deterministic simulation of the production deployment (issue 48): the stage engine driven
by three simulated workers and two operators, their steps interleaved by Hypothesis, over a
simulated broker (messages taken in any order, duplicated, lost with a worker that dies) and
a Redis stand-in for the shot leases that can go down, cut one worker off, or answer a
worker late (the answer it gave before it froze); workers freeze and wake after they were
fenced out and then try to write. Time is simulated: the database's clock, heartbeats,
leases and the sweeper's threshold all read it. On SQLite and PostgreSQL.

The video is told in two shots (the lifecycle model's SHOTS_SPEC), so two workers hold its
shots under one attempt; redos swap a scene's picture or make a range again, planned by one
operator while the other acts (or both at once). The sweeper resumes what lies stale and
offers the shots no one holds, by the engine's own rule (`engine.shots_to_offer`, as the
Celery beat does). An operator may act between two writes of a worker's step; the night may
go on for a while (every worker that is not frozen works, a drawn pace per step, the sweeper
every 30 s) while a frozen worker's lease runs out. Each example leaves out a drawn subset
of the faults and operator actions (swarm testing), so that what it keeps comes often
enough to build the long interleavings a race needs.

After every step:

- (a) no delivered file ever changes; (b) the current version never goes back;
- (i) no store object under segments/ is written by two holders;
- (j) no segment is recorded under an attempt after the job left generate under it;
- (k) a job at rest in `done` has a record for every segment, and each names a file that is
  in the store (a discarded redo or a requeue never leaves a hole);
- (l) no delivered version carries a number a dropped redo reserved;
- (m) the material of the current version is what its delivered redos swapped in;
- (n) a redo is started and delivered as the version its plan showed its operator.

At the end of every example the broker and the workers are left to finish (faults healed),
and the job must settle where `factory status` names a next step.

Budget: a fixed seed; FACTORY_SIM_EXAMPLES / FACTORY_SIM_STEPS raise it for a release check
(docs/benchmarks.md, "Simulation").
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from PIL import Image

from factory.config import Settings
from factory.db import migrate
from factory.db.session import Database
from factory.errors import FactoryError, IllegalTransition, InvalidOperation, StaleAttempt
from factory.job import Job
from factory.manifest import parse_manifest
from factory.ops import Operations
from factory.ops.submit import submit
from factory.pipeline import engine
from factory.pipeline.context import StageContext
from factory.pipeline.generate import WarmTail, generate_segment
from factory.plan.video import next_segment, open_shots, video_plan
from factory.stages import ACTIVE, Stage
from factory.store import open_store
from factory.store.file import FileStore
from factory.wiring import Factory
from tests.conftest import embedded_env
from tests.integration.test_lifecycle_model import SHOTS_SPEC
from tests.integration.test_swap_material import green_picture

EXAMPLES = int(os.environ.get("FACTORY_SIM_EXAMPLES") or 6)
STEPS = int(os.environ.get("FACTORY_SIM_STEPS") or 40)
VERBOSE = os.environ.get("FACTORY_SIM_VERBOSE") == "1"
pytestmark = [pytest.mark.timeout(0)] if "FACTORY_SIM_EXAMPLES" in os.environ else []

LEASE = 30.0  # seconds (simulated) a shot lease outlives its last renewal
STALE_AFTER = 60  # FACTORY_STALE_AFTER, simulated seconds
SWEEP_EVERY = 30  # the beat's sweep, simulated seconds
WORKERS = ("w1", "w2", "w3")
OPERATORS = ("ann", "bob")
REDOS = (
    ("image", "0=material/green.png,as=reference"),  # shot 0 made again
    ("image", "1=material/red.png,as=first-frame"),  # shot 1 made again
    ("range", "2.5-3"),  # segment 1, joined into segment 2
    ("image", "0=none"),
)
FROM = (None, "generate", "encode", "qc", "deliver")
# The steps an example may leave out (swarm testing); workers working and taking messages,
# the night going on and time passing are in every example.
SWARM = ("operator_plans_a_redo", "operators_plan_at_once", "worker_freezes_or_wakes",
         "worker_dies_mid_step", "operator_acts", "operator_acts_while_a_worker_writes",
         "worker_dies", "sweeper", "redis_fault",
         "duplicate")  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.at = datetime(2026, 12, 7, 1, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.at

    def seconds(self) -> float:
        return self.at.timestamp()

    def advance(self, seconds: float) -> None:
        self.at += timedelta(seconds=seconds)


class SimRedis:
    """The leases' Redis: keys with expiry by the simulated clock; it can be down, cut off
    from one worker, or answer a worker late."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.keys: dict[str, tuple[str, float]] = {}
        self.down = False
        self.cut_off: set[str] = set()

    def reachable(self, worker: str) -> bool:
        return not self.down and worker not in self.cut_off

    def owner(self, key: str) -> str | None:
        found = self.keys.get(key)
        return found[0] if found and found[1] > self.clock.seconds() else None


class SimClaims:
    """The sweeper's view of the leases (factory.pipeline.claims.Claims) on the SimRedis."""

    def __init__(self, redis: SimRedis) -> None:
        self.redis = redis

    def held(self, key: str) -> bool:
        return self.redis.owner(key) is not None

    def once(self, key: str, seconds: float) -> bool:
        if self.redis.owner(key) is not None:
            return False
        self.redis.keys[key] = ("once", self.redis.clock.seconds() + seconds)
        return True


@dataclass
class Lease:
    """A shot lease as a worker holds it: fails closed like factory.pipeline.claims."""

    redis: SimRedis
    worker: Worker
    key: str
    token: str
    renewed: float
    lost: bool = False

    @property
    def holder(self) -> str:
        return self.token[:12]

    def held(self) -> bool:
        if self.worker.late_answer is not None:  # asked before it froze, answered now
            answer, self.worker.late_answer = self.worker.late_answer, None
            return answer
        clock = self.redis.clock.seconds()
        if (self.lost or not self.redis.reachable(self.worker.name)
                or clock - self.renewed >= LEASE / 2):  # fmt: skip
            self.lost = True
            return False
        return self.redis.owner(self.key) == self.token

    def renew(self) -> None:
        if self.lost or not self.redis.reachable(self.worker.name):
            self.lost = True
            return
        if self.redis.owner(self.key) != self.token:
            self.lost = True
            return
        self.renewed = self.redis.clock.seconds()
        self.redis.keys[self.key] = (self.token, self.renewed + LEASE)


@dataclass
class Worker:
    name: str
    job: Job | None = None  # what it holds, as it last saw it
    kind: str = ""  # "shot" or "cpu"
    lease: Lease | None = None
    warm: WarmTail | None = None
    frozen: bool = False
    woke: bool = False  # wakes straight into the write it was about to make
    late_answer: bool | None = None

    def drop(self) -> None:
        self.job, self.kind, self.lease, self.warm = None, "", None, None
        self.woke, self.late_answer = False, None


@dataclass
class Model:
    current: int | None = None
    pending: dict[str, dict[str, Any]] | None = None  # the started redo's swaps
    material: dict[str, dict[str, Any]] = field(default_factory=dict)
    planned: dict[str, tuple[int, Any, Any, tuple[str, str]]] = field(default_factory=dict)
    told: int | None = None  # the version the last redo started was planned (shown) to be
    trail: list[str] = field(default_factory=list)


class WorkerKilled(BaseException):
    """kill -9 mid-step: nothing in the engine catches it."""


WRITER: list[tuple[str, int, str | None]] = []  # who is writing now: (worker, attempt, holder)


class Simulation(RuleBasedStateMachine):
    database_url: str
    home: Path

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        home = self.home / uuid.uuid4().hex[:8]
        env = {
            **embedded_env(home),
            "FACTORY_STORE_FSYNC": "0",
            "FACTORY_STALE_AFTER": str(STALE_AFTER),
            "FACTORY_HEARTBEAT_EVERY": "15",
        }
        if self.database_url:
            env["FACTORY_DATABASE_URL"] = self.database_url
        self.settings = Settings.from_env(env)
        self.factory = Factory.open(self.settings)
        self.machine = self.factory.jobs
        self.machine.clock = self.clock
        self.ops = Operations(self.factory, dispatcher=self.dispatch)
        self.ctx = StageContext.from_settings(self.settings, self.machine, self.factory.database)
        self.store = open_store(self.settings.store_url, self.settings.s3)
        self.store_root = home / "store"
        self.redis = SimRedis(self.clock)
        self.broker: list[tuple[Any, ...]] = []
        self.workers = {name: Worker(name) for name in WORKERS}
        self.model = Model()
        self.hashes: dict[str, str] = {}
        self.writers: dict[str, set[tuple[str, int, str | None]]] = {}
        material = home / "material"
        material.mkdir(parents=True)
        green_picture(material / "green.png")
        Image.new("RGB", (96, 96), (200, 40, 30)).save(material / "red.png")
        for path in material.iterdir():
            self.store.put_file(f"material/{path.name}", path)
        self.job_id = ""
        self.left_out: set[str] = set()
        self.swept = self.clock.seconds()
        self.kill_after: int | None = None
        self.meanwhile: tuple[int, Any] | None = None  # (writes, an operator's action)
        for name in (
            "checkpoint",
            "record_segment",
            "transition",
            "reserve_version",
            "commit_version",
            "take_shot",
        ):  # a death mid-step may come at these
            real = getattr(self.machine, name)
            setattr(self.machine, name, self._killable(real))

    def _killable(self, real: Any) -> Any:
        def write(*args: Any, **kwargs: Any) -> Any:
            self.write()
            return real(*args, **kwargs)

        return write

    def teardown(self) -> None:
        if VERBOSE:
            job = self.machine.get(self.job_id) if self.job_id else None
            rest = f"{job.stage.value} v{job.version}" if job else "-"
            print(f"\n{' -> '.join(self.model.trail)}\n= {rest}")
        self.factory.database.dispose()

    # --- the world's pieces ----------------------------------------------------------

    def dispatch(self, found: list[Job]) -> None:
        for job in found:
            if job.stage in (Stage.QUEUED, Stage.GENERATE):
                self.broker.append(("segment", job.job_id, job.attempt))
            elif job.stage in engine.CPU_STAGES:
                self.broker.append(("cpu", job.job_id, job.stage.value, job.attempt))

    def job(self) -> Job:
        return self.machine.get(self.job_id)

    def say(self, text: str) -> None:
        self.model.trail.append(text)

    @contextlib.contextmanager
    def writing(self, worker: Worker, attempt: int) -> Iterator[None]:
        holder = worker.lease.holder if worker.lease is not None else None
        WRITER.append((worker.name, attempt, holder))
        try:
            yield
        finally:
            WRITER.pop()

    def take_lease(self, worker: Worker, job: Job, prefer: int | None = None) -> Lease | None:
        if not self.redis.reachable(worker.name):
            return None
        for shot in sorted(open_shots(job), key=lambda k: (k != prefer, k)):
            key = engine.shot_lease(job, shot)
            if self.redis.owner(key) is not None:
                continue
            token = uuid.uuid4().hex
            self.redis.keys[key] = (token, self.clock.seconds() + LEASE)
            lease = Lease(self.redis, worker, key, token, self.clock.seconds())
            try:
                worker.job = self.machine.take_shot(
                    job.job_id,
                    attempt=job.attempt,
                    shot=shot,
                    holder=lease.holder,
                    worker=worker.name,
                )
            except StaleAttempt:
                return None
            return lease
        return None

    # --- the steps ---------------------------------------------------------------------

    @initialize(data=st.data())
    def submit(self, data: st.DataObject) -> None:
        review = data.draw(st.booleans(), label="review required")
        batch = f"s{uuid.uuid4().hex[:8]}"
        text = SHOTS_SPEC.format(batch=batch, review="review: required\n" if review else "")
        # Swarm testing: each example leaves out some of the faults and operator actions, so
        # that the ones it keeps come often enough to build the long sequences a race needs
        # (an example with every kind of step spreads itself too thin to reach them).
        # (Drawn as "left out?", so that Hypothesis's simplest example keeps every kind.)
        self.left_out = {name for name in SWARM
                         if data.draw(st.booleans(), label=f"swarm {name}")}  # fmt: skip
        made = submit(parse_manifest(text), self.machine, None)
        self.job_id = made.jobs[0].job_id
        self.dispatch(made.jobs)
        self.say(
            "submit"
            + (" (review)" if review else "")
            + (f", without {', '.join(sorted(self.left_out))}" if self.left_out else "")
        )
        # Most examples start from version 1 delivered, where redos and their races begin.
        if data.draw(st.sampled_from((True, True, False)), label="start from v1"):
            self.finish()
            if self.job().stage is Stage.REVIEW:
                self.ops.approve(self.job_id, actor="ann")
                self.finish()
            self.say(f"v{self.job().version} delivered")

    @rule(data=st.data())
    def act(self, data: st.DataObject) -> None:
        """One step of the world: an action drawn among those that apply now, weighted so
        that work goes on between the faults (the first example is mostly plain work)."""
        workers = self.workers.values()
        stage = self.job().stage
        actions = [
            ("worker_works", 6 if self._busy() else 0),
            ("worker_takes", 4 if self.broker and self._idle() else 0),
            ("operator_plans_a_redo", 3 if stage is Stage.DONE else 0),
            ("operators_plan_at_once", 2 if stage is Stage.DONE else 0),
            # (an operator starts what was planned once the job is done: maybe after
            # another operator's redo was delivered meanwhile)
            ("operator_starts_the_redo", 4 if self.model.planned and stage is Stage.DONE else 0),
            ("work_goes_on", 3 if stage in ACTIVE else 0),
            ("worker_freezes_or_wakes",
             3 if any(w.job is not None or w.frozen for w in workers) else 0),
            ("worker_dies_mid_step", 1 if self._busy() else 0),
            ("time_passes", 1),
            ("operator_acts", 1 if self._verbs() else 0),
            ("operator_acts_while_a_worker_writes", 6 if self._busy() else 0),
            ("worker_dies", 1 if any(w.job is not None for w in workers) else 0),
            ("sweeper", 1 if stage in ACTIVE else 0),
            ("redis_fault", 1),
            ("duplicate", 1 if self.broker else 0),
        ]  # fmt: skip
        names = [name for name, weight in actions for _ in range(weight)
                 if name not in self.left_out]  # fmt: skip
        getattr(self, data.draw(st.sampled_from(names), label="action"))(data)

    def work_goes_on(self, data: st.DataObject) -> None:
        """The night goes on for a while: every worker that is not frozen runs its steps and
        takes messages in turn, a second passing each step and the sweeper resuming what
        lies stale, until a worker holds the job in the stage drawn (before its step) or it
        comes to rest. Faults stay as they are: a frozen worker stays frozen (its lease runs
        out meanwhile), a Redis that is down stays down."""
        until = data.draw(st.sampled_from(("encode", "deliver", "rest")), label="until")
        pace = data.draw(st.sampled_from((1, 10)), label="seconds a step")
        self.say(f"work goes on until {until}, {pace} s a step")
        turn = 0
        for _ in range(300):
            if self.job().stage not in ACTIVE:
                break
            busy = self._busy()
            if any(w.job is not None and w.job.stage.value == until for w in busy):
                break
            if self.clock.seconds() - self.swept >= SWEEP_EVERY:
                self.sweeper()
            if busy:
                turn += 1
                self.clock.advance(pace)
                self.step(busy[turn % len(busy)])
            elif self.broker and self._idle():
                with contextlib.suppress(StaleAttempt, IllegalTransition):
                    self._take(self._idle()[0], self.broker.pop(0))
            else:
                self.clock.advance(SWEEP_EVERY)

    def operators_plan_at_once(self, data: st.DataObject) -> None:
        """Both operators look at the same version and plan a redo each."""
        for operator in OPERATORS:
            self._plan(operator, data.draw(st.sampled_from(REDOS), label="redo"))

    def time_passes(self, data: st.DataObject) -> None:
        seconds = data.draw(st.sampled_from((5, 20, 70)), label="seconds")
        self.clock.advance(seconds)
        self.say(f"{seconds} s pass")

    def duplicate(self, data: st.DataObject) -> None:
        message = data.draw(st.sampled_from(self.broker), label="message")
        self.broker.append(message)
        self.say(f"broker duplicates {message}")

    def redis_fault(self, data: st.DataObject) -> None:
        fault = data.draw(st.sampled_from(("down", "up", "cut", "heal")), label="redis")
        if fault == "down":
            self.redis.down = True
        elif fault == "up":
            self.redis.down = False
        elif fault == "cut":
            self.redis.cut_off.add(data.draw(st.sampled_from(WORKERS), label="worker"))
        else:
            self.redis.cut_off.clear()
        self.say(f"redis {fault}")

    def _idle(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.job is None and not w.frozen]

    def _busy(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.job is not None and not w.frozen]

    def worker_takes(self, data: st.DataObject) -> None:
        idle = self._idle()
        worker = data.draw(st.sampled_from(idle), label="worker")
        message = self.broker.pop(data.draw(st.integers(0, len(self.broker) - 1), label="msg"))
        self.say(f"{worker.name} takes {message}")
        with contextlib.suppress(StaleAttempt, IllegalTransition):
            self._take(worker, message)

    def _take(self, worker: Worker, message: tuple[Any, ...]) -> None:
        kind, job_id = message[0], message[1]
        job = self.machine.get(job_id)
        if kind == "segment":
            job = self.machine.claim(job_id, seen_attempt=message[2], worker=worker.name)
            if job.stage is Stage.QUEUED:
                job = self.machine.transition(job_id, attempt=job.attempt, to=Stage.GENERATE)
            if job.stage is not Stage.GENERATE:
                self.dispatch([job])
                return
            for _ in open_shots(job)[1:]:
                self.broker.append(("shot", job_id, job.attempt))
            self._hold_shot(worker, job)
        elif kind == "shot":  # ("shot", job, attempt[, the shot the sweeper offers])
            job = self.machine.join(job_id, attempt=message[2], worker=worker.name)
            self._hold_shot(worker, job, prefer=message[3] if len(message) > 3 else None)
        else:
            stage, attempt = Stage(message[2]), message[3]
            if job.attempt != attempt or job.stage is not stage:
                return
            worker.job = self.machine.claim(job_id, seen_attempt=attempt, worker=worker.name)
            worker.kind = "cpu"

    def _hold_shot(self, worker: Worker, job: Job, prefer: int | None = None) -> None:
        lease = self.take_lease(worker, job, prefer)
        if lease is None:
            self._maybe_encode(worker, job)
            return
        worker.kind, worker.lease = "shot", lease
        worker.job = worker.job or job

    def _maybe_encode(self, worker: Worker, job: Job) -> None:
        job = self.machine.get(job.job_id)
        if job.stage is Stage.GENERATE and next_segment(job) is None:
            with contextlib.suppress(IllegalTransition, StaleAttempt):
                moved = self.machine.transition(job.job_id, attempt=job.attempt, to=Stage.ENCODE)
                self.dispatch([moved])
        worker.drop()

    def worker_works(self, data: st.DataObject) -> None:
        self.step(data.draw(st.sampled_from(self._busy()), label="worker"))

    def step(self, worker: Worker) -> None:
        """One unit of a holder's work: a segment of its shot (then its next shot, or on to
        encode), or a CPU stage, through the stage engine."""
        job = worker.job
        assert job is not None
        self.say(f"{worker.name} works on {job.stage.value} (attempt {job.attempt})")
        if not worker.woke:  # a live holder beats and renews first; a woken one writes at once
            try:
                self.machine.heartbeat(job.job_id, attempt=job.attempt)
            except StaleAttempt:
                worker.drop()
                return
            if worker.lease is not None:
                worker.lease.renew()
            job = self.machine.get(job.job_id)
        worker.woke = False
        settling = engine.settles(self.machine, job.job_id, job.attempt, what="sim")
        with self.writing(worker, job.attempt), settling as ending:
            if worker.kind == "cpu":
                self.dispatch([engine.stage_step(self.ctx, job)])
                worker.drop()
                return
            lease = worker.lease
            assert lease is not None
            plan = next_segment(job, self._shot(lease))
            if plan is not None:
                worker.job, worker.warm = generate_segment(
                    self.ctx, job, worker.warm, shot=plan.shot, keep=lease.held,
                    holder=lease.holder)  # fmt: skip
                return
            worker.lease = None  # its shot is made: another, or on to encode
            self._hold_shot(worker, self.machine.get(job.job_id))
        if ending.how is not None:
            worker.drop()

    @staticmethod
    def _shot(lease: Lease) -> int:
        return int(lease.key.rsplit("/", 1)[1])

    def worker_freezes_or_wakes(self, data: st.DataObject) -> None:
        choices = [w for w in self.workers.values() if w.job is not None or w.frozen]
        worker = data.draw(st.sampled_from(choices), label="worker")
        if worker.frozen:
            worker.frozen, worker.woke = False, worker.job is not None
            self.say(f"{worker.name} wakes")
        elif worker.job is not None:
            worker.frozen = True
            if worker.lease is not None:  # it had asked Redis just before it froze
                worker.late_answer = worker.lease.held()
            self.say(f"{worker.name} freezes")

    def worker_dies(self, data: st.DataObject) -> None:
        choices = [w for w in self.workers.values() if w.job is not None]
        worker = data.draw(st.sampled_from(choices), label="worker")
        worker.drop()
        worker.frozen = False
        self.say(f"{worker.name} dies")

    def worker_dies_mid_step(self, data: st.DataObject) -> None:
        """Killed between two writes of its step (a store put or a fenced write): what it
        wrote stays, nothing after it is written, and the job stays claimed."""
        worker = data.draw(st.sampled_from(self._busy()), label="worker")
        self.kill_after = data.draw(st.integers(1, 6), label="writes")
        self.say(f"{worker.name} dies after {self.kill_after} writes of its next step")
        try:
            self.step(worker)
        except WorkerKilled:
            pass
        finally:
            self.kill_after = None
        worker.drop()

    def write(self) -> None:
        """A write of the step running now: the armed death, or the armed operator's action,
        comes after the Nth."""
        if self.kill_after is not None:
            self.kill_after -= 1
            if self.kill_after < 0:
                raise WorkerKilled("killed mid-step")
        if self.meanwhile is not None:
            writes, action = self.meanwhile
            self.meanwhile = (writes - 1, action) if writes > 1 else None
            if writes <= 1:
                action()

    def operator_acts_while_a_worker_writes(self, data: st.DataObject) -> None:
        """An operator's action lands between two writes of a worker's step; the worker goes
        on with its step as it would (and meets the fences)."""
        worker = data.draw(st.sampled_from(self._busy()), label="worker")
        writes = data.draw(st.integers(1, 6), label="writes")
        self.say(f"{worker.name} steps; after {writes} of its writes, an operator acts:")
        self.meanwhile = (writes, lambda: self.operator_acts(data))
        try:
            self.step(worker)
        finally:
            self.meanwhile = None

    def sweeper(self, data: st.DataObject | None = None) -> None:
        """The beat's sweep: what lies stale resumed, then (Redis answering) the shots no
        one holds offered to idle workers, as tasks/jobs.py's sweep does, by the engine."""
        self.swept = self.clock.seconds()
        claimed, _ = self.machine.claim_stale(
            stale_after=STALE_AFTER,
            waiting=lambda: [(m[1], "generate" if m[0] != "cpu" else m[2],
                              m[2] if m[0] != "cpu" else m[3]) for m in self.broker],
            max_recoveries=1000, worker=f"sim{engine.SWEEPER}",
        )  # fmt: skip
        self.dispatch(claimed)
        offered: list[tuple[Job, int]] = []
        if not self.redis.down:
            waiting: dict[tuple[str, int], list[int | None]] = {}
            for m in self.broker:
                if m[0] == "shot":
                    waiting.setdefault((m[1], m[2]), []).append(m[3] if len(m) > 3 else None)
            offered = engine.shots_to_offer(
                self.machine, SimClaims(self.redis), lambda: waiting,
                recovered={j.job_id for j in claimed}, lease_seconds=LEASE,
                sweep_seconds=SWEEP_EVERY)  # fmt: skip
            self.broker += [("shot", job.job_id, job.attempt, shot) for job, shot in offered]
        self.say(f"sweeper resumes {len(claimed)}, offers {len(offered)} shot(s)")

    # --- operators ----------------------------------------------------------------------

    def operator_plans_a_redo(self, data: st.DataObject) -> None:
        operator = data.draw(st.sampled_from(OPERATORS), label="operator")
        self._plan(operator, data.draw(st.sampled_from(REDOS), label="redo"))

    def _plan(self, operator: str, redo: tuple[str, str]) -> None:
        job = self.job()
        if job.stage is not Stage.DONE:
            return
        try:
            if redo[0] == "range":
                planned, plan = self.ops.redo_plan(self.job_id, range_text=redo[1], cascade=False)
                material = None
            else:
                swap = self.ops._material_redo(job, [redo[1]], (), False, False)
                planned, plan, material = job, swap.plan, swap.material
        except FactoryError:
            return
        self.model.planned[operator] = (planned.attempt, plan, material, redo)
        self.say(f"{operator} plans {redo}")

    def operator_starts_the_redo(self, data: st.DataObject) -> None:
        operator = data.draw(st.sampled_from(sorted(self.model.planned)), label="operator")
        attempt, plan, material, redo = self.model.planned.pop(operator)
        self.say(f"{operator} starts {redo} planned at attempt {attempt}")
        try:
            job = self.machine.start_redo(
                self.job_id, plan=plan.to_dict(), seed=7 if redo[0] == "range" else None,
                prompt=None, reason="sim", actor=operator, material=material,
                planned_attempt=attempt)  # fmt: skip
        except InvalidOperation as exc:
            self.say(f"refused: {str(exc)[:40]}")
            return
        self.model.told = plan.version
        swaps = {}
        if material is not None:
            scene = redo[1].split("=", 1)[0]
            swaps = {scene: material[scene]}
        self.model.pending = swaps
        self.dispatch([job])

    def _verbs(self) -> list[str]:
        """What an operator would do to the job as it is (a refusal is tried too: requeue
        of a running job)."""
        job = self.job()
        verbs = ["requeue"]
        if job.stage in ACTIVE or "redo" in job.progress:
            verbs.append("cancel")
        if job.stage is Stage.REVIEW:
            verbs += ["approve", "reject"]
        return verbs

    def operator_acts(self, data: st.DataObject) -> None:
        operator = data.draw(st.sampled_from(OPERATORS), label="operator")
        verb = data.draw(st.sampled_from(self._verbs()), label="verb")
        self.say(f"{operator} {verb}")
        with contextlib.suppress(FactoryError):
            if verb == "requeue":
                start = data.draw(st.sampled_from(FROM), label="from")
                self.ops.requeue(self.job_id, from_stage=Stage(start) if start else None,
                                 actor=operator)  # fmt: skip
            elif verb == "cancel":
                self.ops.cancel(self.job_id, reason="sim", actor=operator)
            elif verb == "approve":
                self.ops.approve(self.job_id, actor=operator)
            else:
                self.ops.reject(self.job_id, actor=operator, reason="sim")

    # --- invariants ----------------------------------------------------------------------

    @invariant()
    def delivered_files_never_change(self) -> None:  # (a), (b)
        if not self.job_id:
            return
        job = self.job()
        if self.model.current is not None:
            assert job.version is not None and job.version >= self.model.current, self.trail()
        if job.version != self.model.current:  # a delivery: the pending redo is accepted
            self.say(f"v{job.version} delivered")
            if self.model.pending is not None:
                self.model.material.update(self.model.pending)
            self.model.pending = None
            self.model.current = job.version
        elif job.stage is Stage.DONE and "redo" not in job.progress:
            self.model.pending = None  # dropped
        for version in self.machine.versions(self.job_id):
            for name, where in (version.outputs or {}).items():
                key = str(where).split("/store/", 1)[-1] if "://" in str(where) else str(where)
                path = self.store_root / key
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                seen = self.hashes.setdefault(f"v{version.version}/{name}", digest)
                assert seen == digest, f"{self.trail()}: v{version.version} {name} changed"

    @invariant()
    def no_object_has_two_writers(self) -> None:  # (i)
        shared = {k: w for k, w in self.writers.items() if len(w) > 1}
        assert not shared, f"{self.trail()}: written by two holders: {shared}"

    @invariant()
    def nothing_recorded_after_generate(self) -> None:  # (j)
        if not self.job_id:
            return
        left: set[int] = set()
        for event in self.machine.events(self.job_id):
            if event.event == "advanced" and event.detail.get("from") == "generate":
                left.add(event.attempt)
            elif event.event == "segment.done":
                assert event.attempt not in left, (
                    f"{self.trail()}: segment {event.detail.get('segment')} recorded under "
                    f"attempt {event.attempt} after the job left generate under it"
                )

    @invariant()
    def a_done_job_has_every_segment(self) -> None:  # (k)
        if not self.job_id:
            return
        job = self.job()
        if job.stage is not Stage.DONE or job.progress.get("gc"):
            return
        made = self.machine.segments(self.job_id)
        plans = video_plan(job.video)
        assert sorted(made) == [p.index for p in plans], (
            f"{self.trail()}: done at v{job.version} with segment records {sorted(made)}"
        )
        from factory.pipeline.files import Segments

        files = Segments(job, made)
        for plan in plans:
            assert (self.store_root / files.segment(plan.index)).exists(), (
                f"{self.trail()}: segment {plan.index}'s recorded file is missing"
            )

    @invariant()
    def dropped_numbers_stay_dropped(self) -> None:  # (l)
        if not self.job_id:
            return
        reserved: set[int] = set()
        dropped: set[int] = set()
        for event in self.machine.events(self.job_id):
            if event.event == "redo.planned":
                reserved = set()
            elif event.event == "version.reserved":
                reserved.add(int(event.detail["version"]))
            elif event.event == "redo.discarded":
                dropped |= reserved
        delivered = {v.version for v in self.machine.versions(self.job_id)}
        assert not delivered & dropped, (
            f"{self.trail()}: version(s) {sorted(delivered & dropped)} a dropped redo "
            "reserved were published"
        )

    @invariant()
    def material_is_what_was_delivered(self) -> None:  # (m)
        if not self.job_id:
            return
        job = self.job()
        have = job.progress.get("material") or {}
        pending = self.model.pending or {}
        for scene, swapped in self.model.material.items():
            if scene in pending:
                continue  # a running redo swaps it again
            assert have.get(scene) == swapped, (
                f"{self.trail()}: scene {scene} has {have.get(scene)}, but a delivered redo "
                f"swapped in {swapped}"
            )

    @invariant()
    def a_redo_is_delivered_as_planned(self) -> None:  # (n)
        """What the operator was told when planning (to be version N) is what the redo is
        started as (`redo.planned`) and delivered as."""
        if not self.job_id:
            return
        planned = None
        for event in self.machine.events(self.job_id):
            if event.event == "redo.planned":
                planned = event.detail.get("version")
            elif event.event == "redo.delivered":
                assert event.detail["version"] == planned, (
                    f"{self.trail()}: a redo planned as version {planned} was delivered as "
                    f"version {event.detail['version']}"
                )
        if planned is not None and self.model.told is not None:
            assert planned == self.model.told, (
                f"{self.trail()}: a redo shown to its operator as version {self.model.told} "
                f"was started as version {planned}"
            )

    def trail(self) -> str:
        return " -> ".join(self.model.trail[-12:])

    def finish(self) -> None:
        """Faults healed, everyone awake: the work left runs to rest."""
        self.redis.down = False
        self.redis.cut_off.clear()
        for worker in self.workers.values():
            worker.frozen = False
        for _ in range(400):
            if self.job().stage not in ACTIVE:
                break
            busy = [w for w in self.workers.values() if w.job is not None]
            if busy:
                self.clock.advance(1)
                self.step(busy[0])
            elif self.broker:
                with contextlib.suppress(StaleAttempt, IllegalTransition):
                    self._take(self.workers["w1"], self.broker.pop(0))
            else:
                self.clock.advance(STALE_AFTER + 1)
                self.sweeper()
        job = self.job()
        assert job.stage not in ACTIVE, f"{self.trail()}: never settled: {job.stage.value}"
        self.say("settled")
        for check in (self.delivered_files_never_change, self.no_object_has_two_writers,
                      self.nothing_recorded_after_generate, self.a_done_job_has_every_segment,
                      self.dropped_numbers_stay_dropped, self.material_is_what_was_delivered,
                      self.a_redo_is_delivered_as_planned):  # fmt: skip
            check()


@contextlib.contextmanager
def watched_writes(sim: type[Simulation]) -> Iterator[dict[str, set[Any]]]:
    """Every put under segments/ recorded with who made it (the step's worker, attempt,
    holder) in the running simulation's `writers`."""
    real = {name: getattr(FileStore, name) for name in ("put_file", "put_bytes")}
    current: dict[str, Any] = {}

    def wrap(name: str) -> Any:
        def put(store: Any, key: str, *args: Any, **kwargs: Any) -> Any:
            machine = current.get("sim")
            if machine is not None and WRITER:
                machine.write()
                if "/segments/" in key:
                    machine.writers.setdefault(key, set()).add(WRITER[-1])
            return real[name](store, key, *args, **kwargs)

        return put

    for name in real:
        setattr(FileStore, name, wrap(name))
    init = sim.__init__

    def tracked(self: Simulation) -> None:
        init(self)
        current["sim"] = self

    sim.__init__ = tracked  # type: ignore[method-assign]
    try:
        yield current
    finally:
        sim.__init__ = init  # type: ignore[method-assign]
        for name, method in real.items():
            setattr(FileStore, name, method)


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_workers_operators_and_faults_interleaved(database: str, tmp_path: Path,
                                                  pg_database_factory) -> None:  # fmt: skip
    Simulation.home = tmp_path
    Simulation.database_url = ""
    if database == "postgres":
        Simulation.database_url = pg_database_factory()
        migrated = Database(Simulation.database_url)
        migrate.upgrade(migrated)
        migrated.dispose()
    # Each example's job runs to rest at the end (the faults healed): every job settles.
    original = Simulation.teardown

    def teardown(self: Simulation) -> None:
        try:
            if self.job_id:
                self.finish()
        finally:
            original(self)

    Simulation.teardown = teardown  # type: ignore[method-assign]
    try:
        with watched_writes(Simulation):
            run_state_machine_as_test(
                Simulation,
                settings=settings(max_examples=EXAMPLES, stateful_step_count=STEPS,
                                  deadline=None, derandomize=True, database=None,
                                  phases=[Phase.generate],
                                  suppress_health_check=list(HealthCheck)),
            )  # fmt: skip
    finally:
        Simulation.teardown = original  # type: ignore[method-assign]


# --- directed interleavings ------------------------------------------------------------------
# The races the random runs reach too rarely at the suite's budget, replayed step by step
# through the same simulation and its invariants (each was a defect of issue 48: taking its
# fix back makes its scenario fail). A scenario is a list of (step, answers): the answers are
# what the step's draws get, by label; a callable answer picks among the choices.


class Script:
    """Stands for Hypothesis's `data` in a directed run: each draw takes the next scripted
    answer for its label."""

    def __init__(self, answers: dict[str, list[Any]]) -> None:
        self.answers = {label: list(values) for label, values in answers.items()}

    def draw(self, strategy: Any, label: str = "") -> Any:
        queue = self.answers.get(label)
        if not queue and label.startswith("swarm "):
            return False  # a directed run leaves nothing out
        assert queue, f"the scenario gives no answer for the draw {label!r}"
        answer = queue.pop(0)
        return answer(list(strategy.elements)) if callable(answer) else answer


def in_stage(stage: str) -> Any:
    return lambda workers: next(w for w in workers if w.job is not None
                                and w.job.stage.value == stage)  # fmt: skip


def cancel_mid_deliver(writes: int) -> list[tuple[str, dict[str, list[Any]]]]:
    """(l) A redo cancelled between two writes of its deliver step: the number it reserved is
    dropped, and the next redo is delivered under a new one."""
    return [
        ("submit", {"review required": [False], "start from v1": [True]}),
        ("operator_plans_a_redo", {"operator": ["ann"], "redo": [REDOS[2]]}),
        ("operator_starts_the_redo", {"operator": ["ann"]}),
        ("work_goes_on", {"until": ["deliver"], "seconds a step": [1]}),
        (
            "operator_acts_while_a_worker_writes",
            {
                "worker": [in_stage("deliver")],
                "writes": [writes],
                "operator": ["bob"],
                "verb": ["cancel"],
            },
        ),
        ("operator_plans_a_redo", {"operator": ["ann"], "redo": [REDOS[2]]}),
        ("operator_starts_the_redo", {"operator": ["ann"]}),
        ("finish", {}),
    ]


# (n) Two operators plan on v1 (a picture swap, a range); the swap is delivered as v2; the
# range, planned on v1 to be v2, is refused rather than started on v2 and delivered under a
# number no one was told.
SECOND_PLAN_ON_AN_OLD_VERSION = [
    ("submit", {"review required": [False], "start from v1": [True]}),
    ("operators_plan_at_once", {"redo": [REDOS[0], REDOS[2]]}),
    ("operator_starts_the_redo", {"operator": ["ann"]}),
    ("work_goes_on", {"until": ["rest"], "seconds a step": [1]}),
    ("operator_starts_the_redo", {"operator": ["bob"]}),
    ("finish", {}),
]
SCENARIOS = {
    **{f"cancel-mid-deliver-after-{n}": cancel_mid_deliver(n) for n in (1, 2, 3)},
    "second-plan-on-an-old-version": SECOND_PLAN_ON_AN_OLD_VERSION,
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_directed_interleavings_keep_every_invariant(scenario: str, tmp_path: Path) -> None:
    Simulation.home = tmp_path
    Simulation.database_url = ""
    with watched_writes(Simulation):
        sim = Simulation()
        checks = (sim.delivered_files_never_change, sim.no_object_has_two_writers,
                  sim.nothing_recorded_after_generate, sim.a_done_job_has_every_segment,
                  sim.dropped_numbers_stay_dropped, sim.material_is_what_was_delivered,
                  sim.a_redo_is_delivered_as_planned)  # fmt: skip
        try:
            for step, answers in SCENARIOS[scenario]:
                script = Script(answers)
                getattr(sim, step)(*([script] if step != "finish" else []))
                for check in checks:
                    check()
                unused = {label: left for label, left in script.answers.items() if left}
                assert not unused, f"{step}: answers never drawn: {unused}"
        finally:
            sim.teardown()
