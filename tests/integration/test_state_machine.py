"""The state machine against real PostgreSQL and SQLite: transitions, fencing, requeue, cancel."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest

from factory.db.state import JobStateMachine
from factory.errors import IllegalTransition, InvalidOperation, NoSuchJob, StaleAttempt
from factory.job import Job, SegmentRecord
from factory.manifest import parse_manifest
from factory.stages import PIPELINE, Stage
from tests.conftest import manifest_text
from tests.unit.test_stages import EXPECTED_LEGAL

pytestmark = pytest.mark.fast  # in-process, seconds: part of `scripts/test --fast`


def new_job(machine: JobStateMachine, batch: str) -> Job:
    manifest = parse_manifest(manifest_text(batch, videos=1))
    with machine.database.transaction() as conn:
        return machine.create(conn, "test", manifest.videos)[0].job


def job_at(machine: JobStateMachine, batch: str, stage: Stage) -> Job:
    """A job brought to `stage` the way workers would: a claim, then legal transitions."""
    job = new_job(machine, batch)
    job = machine.claim(job.job_id, seen_attempt=job.attempt, worker="test-worker")
    if stage is Stage.FAILED:
        return machine.fail(job.job_id, attempt=job.attempt, kind="test", message="boom")
    if stage is Stage.CANCELLED:
        return machine.cancel(job.job_id, reason="test")
    for target in PIPELINE[1 : PIPELINE.index(stage) + 1]:
        job = machine.transition(job.job_id, attempt=job.attempt, to=target)
    assert job.stage is stage
    return job


@pytest.mark.parametrize(
    ("current", "target"), list(itertools.product(Stage, Stage)), ids=lambda s: s.value
)
def test_every_transition(machine: JobStateMachine, batch_name: str, current: Stage, target: Stage):
    job = job_at(machine, batch_name, current)
    before = machine.events(job.job_id)
    if (current.value, target.value) in EXPECTED_LEGAL:
        after = machine.transition(job.job_id, attempt=job.attempt, to=target)
        assert after.stage is target and after.attempt == job.attempt
        event = machine.events(job.job_id)[-1]
        assert event.detail["from"] == current.value and event.stage is target
        assert event.trace_id == job.trace_id
        if target in (Stage.FAILED, Stage.CANCELLED):
            assert after.stopped_stage is current
    else:
        with pytest.raises(IllegalTransition):
            machine.transition(job.job_id, attempt=job.attempt, to=target)
        unchanged = machine.get(job.job_id)
        assert unchanged.stage is current and unchanged.updated_at == job.updated_at
        assert len(machine.events(job.job_id)) == len(before)


def test_claim_bumps_attempt_and_a_stale_claim_loses(machine: JobStateMachine, batch_name: str):
    job = new_job(machine, batch_name)
    first = machine.claim(job.job_id, seen_attempt=0, worker="w1")
    assert first.attempt == 1 and first.claimed_by == "w1" and first.heartbeat_at is not None
    with pytest.raises(StaleAttempt, match="attempt 1 holds the job now by w1"):
        machine.claim(job.job_id, seen_attempt=0, worker="w2")
    assert machine.get(job.job_id).claimed_by == "w1"


def test_stale_writer_changes_nothing(machine: JobStateMachine, batch_name: str):
    job = new_job(machine, batch_name)
    old = machine.claim(job.job_id, seen_attempt=0, worker="old")
    old = machine.transition(job.job_id, attempt=old.attempt, to=Stage.GENERATE)
    new = machine.claim(job.job_id, seen_attempt=old.attempt, worker="new")
    snapshot = machine.get(job.job_id)
    events_before = len(machine.events(job.job_id))
    with pytest.raises(StaleAttempt):
        machine.checkpoint(job.job_id, attempt=old.attempt, updates={"segments": [0]})
    with pytest.raises(StaleAttempt):
        machine.transition(job.job_id, attempt=old.attempt, to=Stage.ENCODE)
    with pytest.raises(StaleAttempt):
        machine.heartbeat(job.job_id, attempt=old.attempt)
    with pytest.raises(StaleAttempt):
        machine.fail(job.job_id, attempt=old.attempt, kind="x", message="y")
    assert machine.get(job.job_id) == snapshot
    assert len(machine.events(job.job_id)) == events_before
    machine.checkpoint(job.job_id, attempt=new.attempt, updates={"segments": [0]})
    assert machine.get(job.job_id).progress["segments"] == [0]


def test_checkpoint_and_heartbeat(machine: JobStateMachine, batch_name: str):
    job = job_at(machine, batch_name, Stage.GENERATE)
    done = machine.checkpoint(
        job.job_id,
        attempt=job.attempt,
        updates={"segments": [0, 1], "frame": 44},
        event="segment.done",
        detail={"segment": 1},
    )
    assert done.progress["segments"] == [0, 1] and done.progress["frames_total"] == 240
    assert done.heartbeat_at >= job.heartbeat_at and done.updated_at >= job.updated_at
    assert machine.events(job.job_id)[-1].event == "segment.done"
    machine.heartbeat(job.job_id, attempt=job.attempt)
    assert machine.get(job.job_id).heartbeat_at >= done.heartbeat_at


def test_stage_timings_are_recorded(machine: JobStateMachine, batch_name: str):
    job = job_at(machine, batch_name, Stage.MUX)
    timings = job.progress["timings"]
    assert {"queued", "generate", "encode"} <= {k for k, v in timings.items() if "seconds" in v}
    assert "started_at" in timings["mux"] and "seconds" not in timings["mux"]


def test_cancel_fences_the_running_worker(machine: JobStateMachine, batch_name: str):
    job = job_at(machine, batch_name, Stage.GENERATE)
    cancelled = machine.cancel(job.job_id, reason="wrong prompt")
    assert cancelled.stage is Stage.CANCELLED and cancelled.stopped_stage is Stage.GENERATE
    assert cancelled.attempt == job.attempt + 1
    with pytest.raises(StaleAttempt, match="the job was cancelled"):
        machine.checkpoint(job.job_id, attempt=job.attempt, updates={"segments": [0]})
    assert machine.events(job.job_id)[-1].detail == {"from": "generate", "reason": "wrong prompt"}


@pytest.mark.parametrize("stage", [Stage.DONE, Stage.FAILED, Stage.CANCELLED], ids=str)
def test_cancel_refuses_finished_jobs(machine: JobStateMachine, batch_name: str, stage: Stage):
    job = job_at(machine, batch_name, stage)
    with pytest.raises(InvalidOperation, match=f"already {stage.value}"):
        machine.cancel(job.job_id)
    assert machine.get(job.job_id).attempt == job.attempt


def test_requeue_without_from_continues_where_it_failed(machine: JobStateMachine, batch_name: str):
    job = job_at(machine, batch_name, Stage.GENERATE)
    machine.checkpoint(
        job.job_id, attempt=job.attempt, updates={"segments": [0, 1, 2], "frame": 64}
    )
    failed = machine.fail(job.job_id, attempt=job.attempt, kind="cuda", message="out of memory")
    assert failed.last_error["stage"] == "generate" and failed.stopped_stage is Stage.GENERATE
    back = machine.requeue(job.job_id)
    assert back.stage is Stage.GENERATE and back.progress["segments"] == [0, 1, 2]
    assert back.attempt == failed.attempt + 1 and back.last_error is None
    assert back.heartbeat_at is None and back.claimed_by is None and back.stopped_stage is None
    assert machine.events(job.job_id)[-1].detail == {
        "from": "failed",
        "to": "generate",
        "reset": False,
    }


def test_requeue_from_a_stage_resets_that_stage_and_later(
    machine: JobStateMachine, batch_name: str
):
    job = job_at(machine, batch_name, Stage.GENERATE)
    job = machine.checkpoint(job.job_id, attempt=job.attempt, updates={"segments": [0, 1, 2]})
    for stage in (Stage.ENCODE, Stage.MUX, Stage.QC):
        job = machine.transition(job.job_id, attempt=job.attempt, to=stage)
    job = machine.checkpoint(
        job.job_id,
        attempt=job.attempt,
        updates={"encode": {"chunks": [0]}, "qc": {"summary": "fail"}},
    )
    back = machine.requeue(job.job_id, from_stage=Stage.ENCODE)
    assert back.stage is Stage.ENCODE
    assert back.progress["segments"] == [0, 1, 2]
    assert "encode" not in back.progress and "qc" not in back.progress


def test_requeue_from_generate_starts_generation_over(machine: JobStateMachine, batch_name: str):
    job = job_at(machine, batch_name, Stage.GENERATE)
    machine.checkpoint(job.job_id, attempt=job.attempt, updates={"segments": [0, 1], "frame": 44})
    back = machine.requeue(job.job_id, from_stage=Stage.GENERATE)
    assert back.progress["segments"] == [] and back.progress["frame"] == 0


def record(machine: JobStateMachine, job: Job, index: int, **updates) -> Job:
    made = SegmentRecord(index, job.attempt, 1.5 + index, {"spread": 40.0 + index}, None, None)
    return machine.record_segment(
        job.job_id, attempt=job.attempt, record=made, updates=updates,
        detail={"segment": index, "token": "hunter2-not-a-secret"},
    )  # fmt: skip


def test_a_recorded_segment_is_a_row_an_index_and_an_event(
    machine: JobStateMachine, batch_name: str
):
    job = job_at(machine, batch_name, Stage.GENERATE)
    job = machine.interrupt(job.job_id, attempt=job.attempt, reason="gateway away",
                            kind="RetryableError", give_up_after=3600, advice="wait")  # fmt: skip
    job = machine.claim(job.job_id, seen_attempt=job.attempt, worker="w2")
    for index in (0, 1, 2):
        job = record(machine, job, index, frame=(index + 1) * 20)
    assert job.progress["segments"] == [0, 1, 2] and job.progress["frame"] == 60
    assert "interrupted" not in job.progress and job.recoveries == 0
    job = record(machine, job, 1)  # recorded again (a regeneration): still once, in order
    job = record(machine, job, 5)
    job = record(machine, job, 4)  # out of order: kept sorted
    assert job.progress["segments"] == [0, 1, 2, 4, 5]
    assert job == machine.get(job.job_id)
    made = machine.segments(job.job_id)
    assert sorted(made) == [0, 1, 2, 4, 5] and made[4].seconds == 5.5
    assert made[1].attempt == job.attempt and made[1].colour == {"spread": 41.0}
    assert machine.segment(job.job_id, 3) is None
    assert machine.segment_seconds([job.job_id]) == {job.job_id: (5, sum(1.5 + i for i in made))}
    done = [e for e in machine.events(job.job_id) if e.event == "segment.done"]
    assert [e.detail["segment"] for e in done] == [0, 1, 2, 1, 5, 4]
    assert all(e.attempt == job.attempt and e.stage is Stage.GENERATE for e in done)
    # a stale holder records nothing: no row, no index, no event
    newer = machine.claim(job.job_id, seen_attempt=job.attempt, worker="w3")
    with pytest.raises(StaleAttempt, match=r"attempt \d+ holds the job now by w3"):
        record(machine, job, 3)
    assert machine.segment(job.job_id, 3) is None
    assert machine.get(job.job_id).progress["segments"] == [0, 1, 2, 4, 5]
    assert len([e for e in machine.events(job.job_id) if e.event == "segment.done"]) == 6
    # requeue --from generate forgets the rows with the segments
    machine.cancel(job.job_id)
    back = machine.requeue(job.job_id, from_stage=Stage.GENERATE)
    assert back.progress["segments"] == [] and machine.segments(job.job_id) == {}
    assert newer.attempt < back.attempt


def test_requeue_fences_the_old_worker(machine: JobStateMachine, batch_name: str):
    job = job_at(machine, batch_name, Stage.ENCODE)
    machine.requeue(job.job_id)
    with pytest.raises(StaleAttempt):
        machine.transition(job.job_id, attempt=job.attempt, to=Stage.MUX)


def test_requeue_of_a_done_job_needs_from(machine: JobStateMachine, batch_name: str):
    job = job_at(machine, batch_name, Stage.DONE)
    with pytest.raises(InvalidOperation, match="give --from"):
        machine.requeue(job.job_id)
    assert machine.requeue(job.job_id, from_stage=Stage.DELIVER).stage is Stage.DELIVER


def test_requeue_cannot_skip_ahead(machine: JobStateMachine, batch_name: str):
    job = job_at(machine, batch_name, Stage.GENERATE)
    machine.fail(job.job_id, attempt=job.attempt, kind="x", message="y")
    with pytest.raises(InvalidOperation, match="only reached generate"):
        machine.requeue(job.job_id, from_stage=Stage.QC)
    with pytest.raises(InvalidOperation, match="cannot requeue to done"):
        machine.requeue(job.job_id, from_stage=Stage.DONE)
    assert machine.get(job.job_id).stage is Stage.FAILED


def test_cancelled_job_can_be_requeued_to_where_it_stopped(
    machine: JobStateMachine, batch_name: str
):
    job = job_at(machine, batch_name, Stage.MUX)
    machine.cancel(job.job_id)
    assert machine.requeue(job.job_id).stage is Stage.MUX


def test_unknown_job(machine: JobStateMachine):
    for action in (
        lambda: machine.get("nope.x"),
        lambda: machine.cancel("nope.x"),
        lambda: machine.requeue("nope.x"),
        lambda: machine.events("nope.x"),
        lambda: machine.claim("nope.x", seen_attempt=0, worker="w"),
    ):
        with pytest.raises(NoSuchJob):
            action()


def test_timeline_reads_in_order(machine: JobStateMachine, batch_name: str):
    job = job_at(machine, batch_name, Stage.ENCODE)
    machine.cancel(job.job_id)
    machine.requeue(job.job_id)
    names = [e.event for e in machine.events(job.job_id)]
    assert names == ["submitted", "claimed", "advanced", "advanced", "cancelled", "requeued"]


def test_sweeper_claims_stale_jobs_and_gives_up_after_the_budget(
    machine: JobStateMachine, batch_name: str
):
    job = job_at(machine, batch_name, Stage.GENERATE)
    later = JobStateMachine(
        machine.database, clock=lambda: job.heartbeat_at + timedelta(seconds=60)
    )
    claimed, failed = later.claim_stale(
        stale_after=30, waiting=lambda: (), max_recoveries=1, worker="s"
    )
    mine = [j for j in claimed if j.job_id == job.job_id]
    assert len(mine) == 1 and mine[0].recoveries == 1 and mine[0].attempt == job.attempt + 1
    # Waiting in a queue: not stale, left alone.
    much_later = JobStateMachine(
        machine.database, clock=lambda: job.heartbeat_at + timedelta(seconds=600)
    )
    message = (job.job_id, Stage.GENERATE.value, job.attempt + 1)
    claimed, failed = much_later.claim_stale(
        stale_after=30, waiting=lambda: [message], max_recoveries=1, worker="s"
    )
    assert job.job_id not in {j.job_id for j in claimed + failed}
    # Silent again, with its one recovery spent: failed, with the reason.
    claimed, failed = much_later.claim_stale(
        stale_after=30, waiting=lambda: (), max_recoveries=1, worker="s"
    )
    gone = [j for j in failed if j.job_id == job.job_id]
    assert len(gone) == 1 and gone[0].stage is Stage.FAILED
    assert (
        gone[0].last_error["kind"] == "Abandoned"
        and "1 automatic recoveries" in gone[0].last_error["message"]
    )
    assert machine.requeue(job.job_id).stage is Stage.GENERATE  # the operator gives a new budget
