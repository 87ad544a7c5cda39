"""The one hook the alerts hang on (`JobStateMachine.on_settled`): every write that settles a
job (done, failed, cancelled, parked in review) tells the listeners once, after its commit,
whoever made it; writes that leave a job working tell nobody; a rollback tells nobody."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from factory.db.models import jobs
from factory.db.state import JobStateMachine
from factory.job import Job
from factory.stages import Stage
from tests.integration.test_state_machine import job_at, new_job


class Heard:
    """A listener that also reads the job on a connection of its own when it is called:
    what it reads there is what other processes could see at that moment."""

    def __init__(self, machine: JobStateMachine) -> None:
        self.machine = machine
        self.calls: list[tuple[str, Stage, str]] = []  # job, stage told, stage committed

    def __call__(self, job: Job) -> None:
        with self.machine.database.engine.connect() as conn:
            seen = conn.execute(select(jobs.c.stage).where(jobs.c.job_id == job.job_id)).scalar()
        self.calls.append((job.job_id, job.stage, seen))


@pytest.fixture
def heard(machine: JobStateMachine) -> Heard:
    listener = Heard(machine)
    machine.on_settled(listener)
    return listener


def test_working_stages_tell_nobody(machine: JobStateMachine, heard: Heard, batch_name: str):
    job = job_at(machine, batch_name, Stage.QC)
    assert heard.calls == []
    machine.checkpoint(job.job_id, attempt=job.attempt, updates={"frame": 3})
    machine.interrupt(job.job_id, attempt=job.attempt, reason="gateway down")
    assert heard.calls == []


@pytest.mark.parametrize("stage", [Stage.FAILED, Stage.CANCELLED, Stage.REVIEW])
def test_a_settling_write_tells_once_after_its_commit(
    machine: JobStateMachine, heard: Heard, batch_name: str, stage: Stage
):
    job = job_at(machine, batch_name, stage)
    assert heard.calls == [(job.job_id, stage, stage.value)]


def test_delivery_and_the_sweepers_give_up_tell_too(
    machine: JobStateMachine, heard: Heard, batch_name: str
):
    deliver = job_at(machine, batch_name, Stage.DELIVER)
    heard.calls.clear()  # on its way it was parked in review once
    done = machine.transition(deliver.job_id, attempt=deliver.attempt, to=Stage.DONE)
    assert heard.calls == [(done.job_id, Stage.DONE, "done")]

    stale = job_at(machine, f"{batch_name}-s", Stage.GENERATE)
    later = JobStateMachine(
        machine.database, clock=lambda: stale.heartbeat_at + timedelta(seconds=600)
    )
    sweeper_heard = Heard(later)
    later.on_settled(sweeper_heard)
    _, failed = later.claim_stale(
        stale_after=30, waiting=lambda: (), max_recoveries=0, worker="sweeper"
    )  # silent for ten minutes with no recovery left: given up
    assert stale.job_id in {j.job_id for j in failed}
    mine = [call for call in sweeper_heard.calls if call[0] == stale.job_id]
    assert mine == [(stale.job_id, Stage.FAILED, "failed")]


def test_an_operators_settling_action_tells_once(
    machine: JobStateMachine, heard: Heard, batch_name: str
):
    review = job_at(machine, batch_name, Stage.REVIEW)
    heard.calls.clear()
    review = machine.get(review.job_id)
    rejected = machine.decide(review.job_id, actor="ana", approved=False, text="too dark")
    assert heard.calls == [(rejected.job_id, Stage.FAILED, "failed")]
    requeued = machine.requeue(rejected.job_id, actor="ana")  # the same files up for review
    assert heard.calls[-1] == (requeued.job_id, Stage.REVIEW, "review") and len(heard.calls) == 2
    approved = machine.decide(review.job_id, actor="ana", approved=True, text="")
    assert approved.stage is Stage.DELIVER and len(heard.calls) == 2  # working again
    done = machine.transition(approved.job_id, attempt=approved.attempt, to=Stage.DONE)
    assert len(heard.calls) == 3 and heard.calls[-1][1] is Stage.DONE
    queued = machine.requeue(done.job_id, from_stage=Stage.GENERATE, actor="ana")
    assert queued.stage is Stage.GENERATE and len(heard.calls) == 3  # working again
    done = job_at(machine, f"{batch_name}-d", Stage.DONE)
    again = machine.requeue(done.job_id, from_stage=Stage.REVIEW, actor="ana")
    assert heard.calls[-1] == (again.job_id, Stage.REVIEW, "review")  # parked again


def test_a_rolled_back_transaction_tells_nobody(machine: JobStateMachine, batch_name: str):
    told: list[str] = []
    with pytest.raises(RuntimeError), machine.database.transaction() as conn:
        machine.database.after_commit(conn, lambda: told.append("rolled back"))
        raise RuntimeError("the write failed")
    with machine.database.transaction() as conn:
        machine.database.after_commit(conn, lambda: told.append("committed"))
        assert told == []  # not while the transaction is open
    assert told == ["committed"]


def test_a_listener_that_raises_does_not_undo_the_write(machine: JobStateMachine, batch_name: str):
    """Alerts never fail a job: Alerter.job_settled swallows its errors; the write is
    committed before any listener runs, so even a listener that raises cannot undo it."""

    def broken(job: Job) -> None:
        raise OSError("receiver away")

    machine.on_settled(broken)
    job = new_job(machine, batch_name)
    job = machine.claim(job.job_id, seen_attempt=job.attempt, worker="w")
    with pytest.raises(OSError):
        machine.fail(job.job_id, attempt=job.attempt, kind="test", message="boom")
    assert machine.get(job.job_id).stage is Stage.FAILED
