from __future__ import annotations

import itertools

import pytest

from factory.stages import Stage, initial_progress, is_legal, legal_targets, reset_progress

# Written out by hand, independently of the table in factory/stages.py.
EXPECTED_LEGAL = {
    ("queued", "generate"),
    ("generate", "encode"),
    ("encode", "mux"),
    ("mux", "qc"),
    ("qc", "deliver"),
    ("deliver", "done"),
    ("qc", "generate"),
    ("qc", "review"),  # a batch that requires review
    ("review", "deliver"),  # approved (rejected: failed)
} | {
    (s, t)
    for s in ("queued", "generate", "encode", "mux", "qc", "review", "deliver")
    for t in ("failed", "cancelled")
}


@pytest.mark.parametrize(("current", "target"), list(itertools.product(Stage, Stage)))
def test_transition_table(current: Stage, target: Stage):
    assert is_legal(current, target) == ((current.value, target.value) in EXPECTED_LEGAL)


def test_review_is_parked_neither_worked_nor_terminal():
    from factory.stages import ACTIVE, REQUEUE_TARGETS

    assert Stage.REVIEW.is_parked and not Stage.REVIEW.is_terminal
    assert Stage.REVIEW not in ACTIVE  # no worker claims it, the sweeper leaves it
    assert Stage.REVIEW in REQUEUE_TARGETS  # `requeue --from review`: up for review again


def test_terminal_stages_lead_nowhere():
    for stage in (Stage.DONE, Stage.FAILED, Stage.CANCELLED):
        assert legal_targets(stage) == []


def full_progress() -> dict:
    progress = initial_progress(frames_total=100, segments_total=5)
    progress.update(frame=60, segments=[0, 1, 2], anchor={"mean": [1, 2, 3]})
    progress.update(
        encode={"chunks": [0, 1]},
        mux={"done": True},
        qc={"summary": "pass"},
        deliver={"outputs": {"master": "k"}},
    )
    progress["timings"] = {s: {"seconds": 1.0} for s in ("queued", "generate", "encode", "mux")}
    return progress


def test_reset_from_encode_keeps_generation_and_clears_the_rest():
    reset = reset_progress(full_progress(), Stage.ENCODE)
    assert reset["segments"] == [0, 1, 2] and reset["frame"] == 60
    assert not {"encode", "mux", "qc", "deliver"} & reset.keys()
    assert set(reset["timings"]) == {"queued", "generate"}
    assert (reset["frames_total"], reset["segments_total"]) == (100, 5)


def test_reset_from_generate_clears_segments():
    reset = reset_progress(full_progress(), Stage.GENERATE)
    assert reset["segments"] == [] and reset["frame"] == 0 and "anchor" not in reset
    assert "encode" not in reset


def test_reset_from_deliver_only_forgets_delivery():
    original = full_progress()
    reset = reset_progress(original, Stage.DELIVER)
    assert reset["qc"] == {"summary": "pass"} and "deliver" not in reset
    assert original["deliver"] == {"outputs": {"master": "k"}}  # the input is not mutated
