"""The progress column stores the segments done as ranges and shows them as a list."""

from __future__ import annotations

from sqlalchemy.dialects import postgresql, sqlite

from factory.db.models import Progress, segment_ranges


def test_segment_indices_become_half_open_ranges():
    assert segment_ranges([]) == []
    assert segment_ranges([0, 1, 2]) == [[0, 3]]
    assert segment_ranges([6, 0, 1, 2, 5, 2]) == [[0, 3], [5, 7]]


def test_progress_round_trips_through_its_stored_form():
    column = Progress()
    shown = {"frame": 40, "segments": [0, 1, 2, 3, 9], "segments_total": 3000}
    for dialect in (postgresql.dialect(), sqlite.dialect()):
        stored = column.process_bind_param(shown, dialect)
        assert stored == {"frame": 40, "segment_ranges": [[0, 4], [9, 10]], "segments_total": 3000}
        assert column.process_result_value(stored, dialect) == shown
    three_thousand = column.process_bind_param({"segments": list(range(3000))}, sqlite.dialect())
    assert three_thousand == {"segment_ranges": [[0, 3000]]}  # what a checkpoint rewrites
    legacy = {"segments": [0, 1], "frame": 2}  # a row written before ranges reads the same
    assert column.process_result_value(legacy, sqlite.dialect()) == legacy


def test_an_element_of_the_document_reads_as_its_own_value():
    """`select(jobs.c.progress["qc", "passed"])` hands the element's value to the type (gc's
    query); a bool, a number or a list is not a document and passes through unchanged."""
    column = Progress()
    for dialect in (postgresql.dialect(), sqlite.dialect()):
        for value in (True, False, 3, "done", [0, 1], None, {"state": "removed"}):
            assert column.process_result_value(value, dialect) == value
            assert column.process_bind_param(value, dialect) == value
