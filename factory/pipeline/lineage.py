"""What made each frame of a job's current content: the first run, then every redo delivered
since, in order (and the redo running now). Pure bookkeeping; nothing is read or written.

A redo of segments a..b joined into segment j = b + 1 keeps j's frames *as the version before
made them* (continuing from that version's segment b) and cross-fades only j's first overlap
frames from the new tail. Making the video again from nothing (`requeue --from generate`,
after gc or not) must make those same frames, so it cannot simply run the segments in order
with today's seeds: segment j is made from a past that no longer exists. The lineage says,
for each segment, which operation last made it (or joined it), with the seeds, prompts and
drift anchor that operation used; factory/pipeline/generate.py makes a past state again
(``state(k, i)``: segment i as it stood after operation k) where a join needs it.

Operation 0 is the first run (it makes every segment); operation k >= 1 is the k-th redo in
the current version's history. Each redo records the seeds, prompts and anchor in effect
*before* it (``progress.redo.before``, copied to its version's record on delivery), so the
values an operation ran with are the next one's "before", and the last one's are the job's
own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Operation:
    first: int  # the segments it made: first..last
    last: int
    join: int | None  # the kept segment it cross-faded into, if any
    seeds: Any  # progress.seeds / progress.prompts as they were while it ran
    prompts: Any
    anchor: dict[str, list[float]] | None  # the drift anchor it ran with
    own_anchor: bool = False  # the last operation: it runs with the job's anchor as it is now
    live: bool = False  # the redo running now (its join source is a stored file)
    # progress.material as it was while it ran: the pictures and camera moves it made its
    # segments with (factory/plan/material.py); None: the manifest's own
    material: dict[str, Any] | None = None

    def made(self, index: int) -> bool:
        return self.first <= index <= self.last


@dataclass(frozen=True)
class Lineage:
    operations: tuple[Operation, ...]

    @property
    def final(self) -> int:
        return len(self.operations) - 1

    def touched(self, k: int, index: int) -> int:
        """The last operation up to ``k`` that made segment ``index`` or joined into it: the
        segment after operation ``k`` is as that operation left it."""
        for t in range(k, 0, -1):
            op = self.operations[t]
            if op.made(index) or op.join == index:
                return t
        return 0

    def joined(self, k: int, index: int) -> bool:
        """Whether operation ``k`` cross-faded into segment ``index`` (rather than made it)."""
        op = self.operations[k]
        return k > 0 and op.join == index and not op.made(index)


def lineage(
    progress: Mapping[str, Any],
    segments_total: int,
    redos: Sequence[Mapping[str, Any]],
) -> Lineage | None:
    """The lineage of a job's content. ``redos``: the `detail` of each delivered redo version
    up to the current one, in order. None when a redo in it was delivered before redos
    recorded what they ran after (its past cannot be made again)."""
    steps = [dict(r) for r in redos]
    running = progress.get("redo")
    if running:
        # A redo started before redos recorded their past ran after what it put back on
        # discard (restore) and the job's anchor, which no segment of it has changed yet.
        restore = running.get("restore", {}).get("progress", {})
        before = running.get("before") or {
            "seeds": restore.get("seeds"), "prompts": restore.get("prompts"),
            "anchor": progress.get("anchor"), "material": restore.get("material"),
        }  # fmt: skip
        steps.append({**running, "before": before, "live": True})
    if any("before" not in step for step in steps):
        return None
    # A redo that only changed joins between shots made no segment: it changed no seed,
    # prompt, anchor or material either, so the next operation's "before" is what it ran
    # after. (A redo recorded before material could be swapped ran with the manifest's.)
    steps = [step for step in steps if step["segments"]]
    before = [step["before"] for step in steps]
    ops = []
    for k in range(len(steps) + 1):
        during = before[k] if k < len(before) else None
        seeds = during["seeds"] if during else progress.get("seeds")
        prompts = during["prompts"] if during else progress.get("prompts")
        anchor = during.get("anchor") if during else None
        material = during.get("material") if during else progress.get("material")
        own = during is None
        if k == 0:
            ops.append(Operation(0, segments_total - 1, None, seeds, prompts, anchor, own,
                                 material=material))  # fmt: skip
            continue
        step = steps[k - 1]
        segments = [int(s) for s in step["segments"]]
        join = step.get("join")
        ops.append(
            Operation(
                min(segments), max(segments), None if join is None else int(join), seeds,
                prompts, anchor, own, live=bool(step.get("live")), material=material,
            )
        )  # fmt: skip
    return Lineage(tuple(ops))
