"""An operator's redo of a time range of a delivered job (factory/plan/redo.py): started (the job
goes back to `generate` for the plan's segments, fenced like requeue), and discarded when
it will not be delivered (rejected in review, cancelled, or dropped after it failed): the
job is `done` again at the version it had.
"""

from __future__ import annotations

import copy
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select, update

from factory.db.core import MachineCore, _by, _insert_for
from factory.db.models import batches, job_segments, job_versions, jobs
from factory.errors import InvalidOperation
from factory.job import Job
from factory.plan.redo import give
from factory.stages import Action, Stage


class RedoActions(MachineCore):
    """An operator's redo of a delivered job: started, and discarded."""

    # --- redo a time range of a delivered job (factory/plan/redo.py) -----------------------

    def start_redo(
        self, job_id: str, *, plan: dict[str, Any], seed: int | None, prompt: str | None,
        reason: str, actor: str, joins: dict[str, Any] | None = None,
        material: dict[str, Any] | None = None, planned_attempt: int | None = None,
    ) -> Job:  # fmt: skip
        """A delivered job goes back to `generate` for the plan's segments only: they leave
        ``progress.segments`` (the generate stage makes exactly those again, each from the
        stored tail before it), the later stages start afresh, and the delivery stays as it
        is until the new version passes QC. Fenced like requeue (attempt + 1). A plan without
        segments changes `joins` between shots (factory/plan/rejoin.py): the job goes to
        `encode` with them as ``progress.joins``. ``material``: ``progress.material`` as a
        redo that swaps a scene's picture or camera move leaves it (factory/plan/material.py).
        ``planned_attempt``: the attempt the plan was made against; a job that moved since (an
        operator's redo, requeue or cancel in between) is refused, never redone over it."""
        with self.database.transaction() as conn:
            job = self._read(conn, job_id, lock=True)
            if planned_attempt is not None:
                _refuse_if_moved(job, planned_attempt, plan, self._next_version(conn, job))
            if Action.REDO not in job.actions and job.stage is not Stage.DONE:
                raise InvalidOperation(
                    f"job {job_id} is {job.stage.value}; only a delivered (done) job can be "
                    "redone" + ("; a redo of it is running" if job.progress.get("redo") else ""),
                    field="job",
                )
            if Action.REDO not in job.actions:  # done, but gc took what a redo continues from
                raise InvalidOperation(
                    f"job {job_id}: gc removed the segments and chunks a redo continues from; "
                    "`factory requeue --from generate` makes the whole video again",
                    field="job",
                )
            redone = set(plan["segments"])
            join = plan.get("join")
            rows = conn.execute(
                select(job_segments).where(
                    job_segments.c.job_id == job_id,
                    job_segments.c.segment.in_(sorted(redone | {join} - {None})),
                )
            ).all()
            # The files the version before made these segments from: its encoded chunks are
            # named by them, and a redo copies the GOPs it does not change from those chunks.
            previous = {str(row.segment): row.attempt for row in rows}
            holders = {str(row.segment): row.holder for row in rows if row.holder}
            # What a discarded redo (rejected, cancelled) puts back: the records of the segments
            # it replaces and the later stages' progress of the version before it.
            restore = {
                "progress": {k: job.progress[k] for k in _REDO_RESTORES if k in job.progress},
                "segments": [_segment_row(row) for row in rows],
            }
            # The number this redo is expected to be delivered as (the deliver stage takes the
            # next free one under the row lock; this is for the plan and the reviewer).
            plan = {**plan, "version": self._next_version(conn, job)}
            source = None
            if join is not None:
                source = {
                    "index": join,
                    "attempt": previous.get(str(join)),
                    **({"holder": holders[str(join)]} if str(join) in holders else {}),
                }
            now = self.now(conn)
            progress = {k: v for k, v in job.progress.items() if k not in ("encode", "mux", "qc")}
            # The chunks keep the epoch the delivered version's are named by, so the chunks
            # the redo does not touch are that version's files, reused as they are.
            encode = job.progress.get("encode", {})
            joined = "joined" in encode and "epoch" in encode
            epoch = encode["epoch"] if joined else progress.get("epoch", 0)
            progress["encode"] = {"epoch": int(epoch)}
            progress["segments"] = [i for i in job.progress["segments"] if i not in redone]
            if redone:
                progress["frame"] = min(progress.get("frame", 0), plan["changed_start"])
                first, end = min(redone), max(redone) + 1  # a redo's segments are consecutive
                if seed is not None:
                    progress["seeds"] = give(progress.get("seeds"), first, end, seed)
                if prompt:
                    progress["prompts"] = give(progress.get("prompts"), first, end, prompt)
            if joins is not None:
                progress["joins"] = joins
            if material is not None:
                progress["material"] = material
            stage = Stage.GENERATE if redone else Stage.ENCODE
            progress["redo"] = {
                **plan, "seed": seed, "prompt": prompt, "reason": reason, "actor": actor,
                "join_source": source, "at": now.isoformat(), "from_attempt": job.attempt,
                "previous": previous, "restore": restore,
                **({"previous_holders": holders} if holders else {}),
                # What the version before was made with: making this version again from
                # nothing replays its join from that past (factory/pipeline/lineage.py).
                "before": {k: job.progress.get(k) for k in _LINEAGE_KEYS},
            }  # fmt: skip
            progress["timings"] = {stage.value: {"started_at": now.isoformat()}}
            conn.execute(
                update(jobs)
                .where(jobs.c.job_id == job_id, jobs.c.attempt == job.attempt)
                .values(stage=stage.value, progress=progress, attempt=job.attempt + 1,
                        stopped_stage=None, last_error=None, claimed_by=None, heartbeat_at=None,
                        recoveries=0, updated_at=now)
            )  # fmt: skip
            detail = {
                "range": f"{plan['start']:g}-{plan['end']:g}", "segments": plan["segments"],
                "join": join, "chunks": plan["chunks"], "version": plan["version"],
                "cascade": plan["cascade"], "reason": reason, **_by(actor),
                **({"seed": seed} if seed is not None else {}),
                **({"prompt": prompt} if prompt else {}),
                **({"joins": plan["joins"]} if plan.get("joins") else {}),
                **({"material": plan["material"]} if plan.get("material") else {}),
            }  # fmt: skip
            self._event(conn, job_id, stage, "redo.planned", job.attempt + 1,
                        job.trace_id, detail)  # fmt: skip
            return self._read(conn, job_id)

    def _discard_redo(self, conn: Connection, job: Job, *, actor: str, why: str, how: str) -> Job:
        """A redo that will not be delivered (rejected in review, cancelled, or dropped after it
        failed): the job is `done` again at the version it had, with the records of the
        segments and the later stages' progress as that version had them; the redo's seeds
        and prompts go with it. Fences out whoever holds the job (attempt + 1)."""
        redo = job.progress["redo"]
        restore = redo["restore"]
        now = self.now(conn)
        progress = {k: v for k, v in job.progress.items()
                    if k not in (*_REDO_RESTORES, "redo", "interrupted")}  # fmt: skip
        progress |= copy.deepcopy(restore["progress"])
        for key in restore.get("absent", ()):  # keys a requeue of the redo added since
            progress.pop(key, None)
        if (redo.get("before") or {}).get("anchor"):  # a redo of segment 0 moved it
            progress["anchor"] = copy.deepcopy(redo["before"]["anchor"])
        progress["segments"] = list(range(progress.get("segments_total", 0)))
        progress["frame"] = progress.get("frames_total", progress.get("frame", 0))
        for row in restore["segments"]:
            values = {**row, "made_at": _parse_time(row.get("made_at"))}
            conn.execute(
                _insert_for(conn)(job_segments)
                .values(job_id=job.job_id, **values)
                .on_conflict_do_update(index_elements=["job_id", "segment"],
                                       set_={k: v for k, v in values.items() if k != "segment"})
            )  # fmt: skip
        conn.execute(
            update(jobs)
            .where(jobs.c.job_id == job.job_id, jobs.c.attempt == job.attempt)
            .values(stage=Stage.DONE.value, progress=progress, attempt=job.attempt + 1,
                    stopped_stage=None, last_error=None, claimed_by=None, heartbeat_at=None,
                    recoveries=0, updated_at=now)
        )  # fmt: skip
        conn.execute(
            update(batches).where(batches.c.batch == job.batch).values(review_notified_at=None)
        )
        # A number the redo's delivery reserved is never published: the next redo takes the
        # next free one, never files a dropped writer may have left under this one's prefix.
        dropped = (
            conn.execute(
                update(job_versions)
                .where(job_versions.c.job_id == job.job_id, job_versions.c.state == "pending")
                .values(state="dropped")
                .returning(job_versions.c.version)
            )
            .scalars()
            .all()
        )
        detail = {"from": job.stage.value, "how": how, "reason": why, "version": job.version,
                  "range": f"{redo['start']:g}-{redo['end']:g}", "segments": redo["segments"],
                  **({"dropped_versions": sorted(dropped)} if dropped else {}),
                  **_by(actor)}  # fmt: skip
        if how == "rejected":
            self._event(conn, job.job_id, Stage.DONE, "rejected", job.attempt + 1, job.trace_id,
                        {"from": job.stage.value, "reason": why, **_by(actor)})  # fmt: skip
        self._event(conn, job.job_id, Stage.DONE, "redo.discarded", job.attempt + 1,
                    job.trace_id, detail)  # fmt: skip
        return self._settled(conn, self._read(conn, job.job_id))


# What the version before a redo was made with (factory/pipeline/lineage.py).
_LINEAGE_KEYS = ("seeds", "prompts", "anchor", "material")
# Progress keys a redo replaces and a discarded redo puts back as they were before it.
_REDO_RESTORES = ("encode", "mux", "qc", "review", "seeds", "prompts", "timings", "joins",
                  "material")  # fmt: skip


def _refuse_if_moved(job: Job, planned_attempt: int, plan: dict[str, Any], version: int) -> None:
    """A plan is made against one state of the job (what it reads: segments, joins, material,
    the next version number); started over another it would undo what came between."""
    if job.attempt == planned_attempt and plan.get("version", version) == version:
        return
    raise InvalidOperation(
        f"job {job.job_id}: the job changed since this plan; plan it again (planned against "
        f"attempt {planned_attempt} to be version {plan.get('version')}; the job is "
        f"{job.stage.value} at attempt {job.attempt} now, its next version {version})",
        field="job",
    )


def _segment_row(row: Any) -> dict[str, Any]:
    data = {k: v for k, v in row._mapping.items() if k != "job_id"}
    made = data.get("made_at")
    data["made_at"] = made.isoformat() if made is not None else None
    return data


def _parse_time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None
