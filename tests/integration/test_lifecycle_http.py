"""The lifecycle model test (test_lifecycle_model.py) with the operator actions sent through a
real `factory serve` (its API, an operator token); the workers, the sweeper and gc stay in
this process, on the same home. (A file of its own: pytest-xdist runs it beside the
others.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis.stateful import run_state_machine_as_test

from tests.integration.test_lifecycle_model import (
    Reference,
    Server,
    World,
    budget,
    machine_for,
    pytestmark,  # noqa: F401 - a release budget lifts pytest's per-test limit here too
)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Reference:
    return Reference(tmp_path_factory.mktemp("reference"))


def test_the_same_actions_through_the_http_api(tmp_path: Path, reference: Reference) -> None:
    world = World(tmp_path / "home")
    server = Server(world)
    try:
        model = machine_for(world, reference, review=(False, True), server=server)
        run_state_machine_as_test(model, settings=budget(examples=2, steps=10))
    finally:
        server.stop()
