"""Which operation made each segment of a job's content (factory/pipeline/lineage.py)."""

from __future__ import annotations

from factory.pipeline.lineage import lineage

A0 = {"mean": [1.0, 2.0, 3.0], "std": [4.0, 5.0, 6.0]}
A1 = {"mean": [9.0, 9.0, 9.0], "std": [1.0, 1.0, 1.0]}


def _redo(segments: list[int], join: int | None, seeds=None, prompts=None, anchor=None) -> dict:
    return {
        "kind": "redo",
        "segments": segments,
        "join": join,
        "before": {"seeds": seeds, "prompts": prompts, "anchor": anchor},
    }


def test_the_first_run_alone_made_everything_with_the_jobs_own_values() -> None:
    found = lineage({"seeds": None, "anchor": A0}, 6, [])
    assert found is not None and found.final == 0
    assert [found.touched(0, i) for i in range(6)] == [0] * 6
    op = found.operations[0]
    assert op.own_anchor and op.seeds is None and not found.joined(0, 3)


def test_each_redo_runs_with_what_the_next_one_recorded_before_it() -> None:
    first = _redo([0, 1], 2, anchor=A0)  # made 0-1 with seed 7, joined into 2
    second = _redo([4], 5, seeds=[[0, 2, 7]], anchor=A1)  # made 4 with seed 9, joined into 5
    progress = {"seeds": [[0, 2, 7], [4, 5, 9]], "anchor": A1}
    found = lineage(progress, 8, [first, second])
    assert found is not None and found.final == 2
    base, one, two = found.operations
    assert (base.seeds, base.anchor, base.own_anchor) == (None, A0, False)
    assert (one.first, one.last, one.join, one.seeds, one.anchor) == (0, 1, 2, [[0, 2, 7]], A1)
    assert two.own_anchor and two.seeds == progress["seeds"]
    # Now: 0-1 by the first redo, 2 joined by it, 3 from the first run, 4 by the second
    # redo, 5 joined by it, 6-7 from the first run.
    assert [found.touched(2, i) for i in range(8)] == [1, 1, 1, 0, 2, 2, 0, 0]
    assert found.joined(1, 2) and found.joined(2, 5) and not found.joined(1, 1)
    # As the version before the second redo had them:
    assert [found.touched(1, i) for i in range(8)] == [1, 1, 1, 0, 0, 0, 0, 0]


def test_a_later_redo_that_makes_a_joined_segment_again_takes_it_over() -> None:
    found = lineage({}, 6, [_redo([1], 2), _redo([2, 3], 4)])
    assert found is not None
    assert found.touched(2, 2) == 2 and not found.joined(2, 2)
    assert found.touched(1, 2) == 1 and found.joined(1, 2)


def test_the_running_redo_is_the_last_operation_and_live() -> None:
    running = {"segments": [3], "join": 4, "before": {"seeds": None, "prompts": None}}
    found = lineage({"redo": running, "seeds": [[3, 4, 5]]}, 6, [])
    assert found is not None and found.operations[-1].live
    assert found.touched(1, 4) == 1 and found.joined(1, 4)


def test_a_running_redo_from_before_lineages_runs_after_what_it_would_put_back() -> None:
    running = {"segments": [3], "join": 4, "restore": {"progress": {"seeds": [[0, 1, 2]]}}}
    found = lineage({"redo": running, "anchor": A0}, 6, [])
    assert found is not None
    assert found.operations[0].seeds == [[0, 1, 2]] and found.operations[0].anchor == A0


def test_a_delivered_redo_from_before_lineages_cannot_be_replayed() -> None:
    old = {"kind": "redo", "segments": [1], "join": 2}
    assert lineage({}, 6, [old]) is None
