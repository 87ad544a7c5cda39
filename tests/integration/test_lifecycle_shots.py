"""The lifecycle model test (test_lifecycle_model.py) on the video told in shots: the plain
batch's actions on a video with a cut, redo and cascade stop at the shot's end, the cut
stays a chunk's first frame through splices, joins change, scenes' material is swapped, and
every invariant holds. (A file of its own: pytest-xdist runs it beside the others.)"""

from __future__ import annotations

from pathlib import Path

from hypothesis.stateful import run_state_machine_as_test

from tests.integration.test_lifecycle_model import (
    SHOTS_SPEC,
    Reference,
    World,
    budget,
    machine_for,
    pytestmark,  # noqa: F401 - a release budget lifts pytest's per-test limit here too
)


def test_the_lifecycle_of_a_batch_told_in_shots(tmp_path: Path) -> None:
    world = World(tmp_path / "home", SHOTS_SPEC)
    made = Reference(tmp_path / "reference", SHOTS_SPEC)
    model = machine_for(world, made, review=(False,))
    run_state_machine_as_test(model, settings=budget(examples=4, steps=10))
