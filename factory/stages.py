"""Job stages and the part of the progress JSON each stage owns.

``queued → generate → encode → mux → qc → deliver → done``; ``failed`` and ``cancelled``
are terminal. ``qc → generate`` is the quality gate sending a bad seam back for
regeneration. A batch that requires review goes ``qc → review → deliver``: ``review`` is
parked (no worker holds it, the sweeper leaves it) until a person approves (``deliver``) or
sends it back (``failed``, requeueable). The state machine in ``factory.db.state`` is the
only writer of a job's stage.
"""

from __future__ import annotations

import copy
import itertools
from enum import StrEnum
from typing import Any


class Stage(StrEnum):
    QUEUED = "queued"
    GENERATE = "generate"
    ENCODE = "encode"
    MUX = "mux"
    QC = "qc"
    REVIEW = "review"
    DELIVER = "deliver"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL

    @property
    def is_parked(self) -> bool:
        return self in PARKED


PIPELINE: tuple[Stage, ...] = (
    Stage.QUEUED,
    Stage.GENERATE,
    Stage.ENCODE,
    Stage.MUX,
    Stage.QC,
    Stage.REVIEW,
    Stage.DELIVER,
    Stage.DONE,
)
TERMINAL = frozenset({Stage.DONE, Stage.FAILED, Stage.CANCELLED})
# Waiting for a person: not terminal, but no worker claims it and the sweeper leaves it.
PARKED = frozenset({Stage.REVIEW})
ACTIVE = tuple(s for s in PIPELINE if s not in TERMINAL and s not in PARKED)
REQUEUE_TARGETS = tuple(s for s in PIPELINE if s not in TERMINAL)  # a requeue restarts here

# Transitions a worker may make, besides `failed` and `cancelled` from any active stage.
_FORWARD = dict(itertools.pairwise(PIPELINE))
_EXTRA = {(Stage.QC, Stage.GENERATE), (Stage.QC, Stage.DELIVER)}  # deliver: no review


def is_legal(current: Stage, target: Stage) -> bool:
    if current in TERMINAL:
        return False
    if target in (Stage.FAILED, Stage.CANCELLED):
        return True
    return _FORWARD.get(current) == target or (current, target) in _EXTRA


def legal_targets(current: Stage) -> list[Stage]:
    return [t for t in Stage if is_legal(current, t)]


def order(stage: Stage) -> int:
    return PIPELINE.index(stage)


class Action(StrEnum):
    """What an operator may do to a job (the CLI's commands, the API's and console's)."""

    APPROVE = "approve"
    REJECT = "reject"
    REQUEUE = "requeue"
    REDO = "redo"
    CANCEL = "cancel"


def allowed_actions(
    stage: Stage, *, redo_to_drop: bool = False, collected: bool = False
) -> frozenset[Action]:
    """The one table of what may be done in each stage: the state machine refuses the rest,
    the CLI's next step names these and the console shows a button for each.

    `redo_to_drop`: a redo is running or stopped in the job, recorded with the version to go
    back to (a cancel drops it, even once it failed). `collected`: gc removed what a redo
    continues from (a requeue --from generate makes the video again instead)."""
    allowed = {Action.REQUEUE}  # from a stage it reached, or where it stopped
    if stage is Stage.REVIEW:
        allowed |= {Action.APPROVE, Action.REJECT}
    if stage is Stage.DONE and not collected:
        allowed.add(Action.REDO)
    if not stage.is_terminal or (redo_to_drop and stage is Stage.FAILED):
        allowed.add(Action.CANCEL)
    return frozenset(allowed)


# What each stage writes into `progress`; a requeue from a stage clears it and everything after.
STAGE_KEYS: dict[Stage, tuple[str, ...]] = {
    # (and the job's `job_segments` rows, which requeue deletes with them)
    Stage.GENERATE: ("frame", "segments", "anchor", "holders"),
    Stage.ENCODE: ("encode",),
    Stage.MUX: ("mux",),
    Stage.QC: ("qc",),
    Stage.REVIEW: ("review",),
    Stage.DELIVER: ("deliver",),
}


def initial_progress(frames_total: int, segments_total: int) -> dict[str, Any]:
    return {
        "frame": 0,
        "frames_total": frames_total,
        "segments": [],
        "segments_total": segments_total,
        "timings": {},
    }


def reset_progress(progress: dict[str, Any], start: Stage) -> dict[str, Any]:
    """Progress with the work of ``start`` and every later stage forgotten; earlier work kept."""
    fresh = initial_progress(progress.get("frames_total", 0), progress.get("segments_total", 0))
    result = copy.deepcopy(progress)
    for stage in PIPELINE[order(start) :]:
        for key in STAGE_KEYS.get(stage, ()):
            if key in fresh:
                result[key] = copy.deepcopy(fresh[key])
            else:
                result.pop(key, None)
        result.setdefault("timings", {}).pop(stage.value, None)
    return result
