"""The deliver stage's writes (factory/pipeline/deliver.py), fenced like every worker write:
the version it writes is reserved under the job's row lock, and published, with the job
`done`, once all its files are stored and verified.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import insert, select, update

from factory.db.core import MachineCore, _with_timing
from factory.db.models import job_segments, job_versions
from factory.errors import StaleAttempt
from factory.job import Job, VersionRecord
from factory.stages import Stage


class Delivery(MachineCore):
    """The deliver stage's fenced writes: a version reserved, then published."""

    # --- delivery: versions (factory/pipeline/deliver.py) -----------------------------

    def reserve_version(
        self, job_id: str, *, attempt: int, prefix_for: Callable[[int], str]
    ) -> VersionRecord:
        """The version the deliver stage of ``attempt`` writes, under the job's row lock: a
        number above every published one, with its own store prefix. The same attempt asking
        again gets its own reservation back; a number an earlier attempt reserved and never
        published (its delivery died or was fenced out) is taken over, so an interrupted first
        delivery still lands at the job's own prefix (DESIGN.md's keys); the taker writes and
        verifies every file of it again before publishing it."""
        with self.database.transaction() as conn:
            job = self._held(conn, job_id, attempt)
            if job.stage is not Stage.DELIVER:
                raise self._fenced(conn, job_id, attempt)
            pending = self._unpublished(conn, job)
            if pending is not None and pending.attempt == attempt:
                return VersionRecord.from_row(pending)
            version = self._next_version(conn, job)
            redo = job.progress.get("redo")
            if redo:
                detail: dict[str, Any] = {
                    "kind": "redo", "range": [redo["start"], redo["end"]],
                    "segments": redo["segments"], "join": redo.get("join"),
                    "chunks": redo["chunks"], "reason": redo.get("reason", ""),
                    **({"before": redo["before"]} if "before" in redo else {}),
                    **({"joins": redo["joins"]} if redo.get("joins") else {}),
                    **({"material": redo["material"]} if redo.get("material") else {}),
                }  # fmt: skip
                actor = redo.get("actor", "")
            else:
                detail = {"kind": "first" if job.version is None else "redelivery"}
                actor = ""
            if review := job.progress.get("review"):
                detail["review"] = review
            made = conn.execute(
                select(job_segments.c.segment, job_segments.c.attempt).where(
                    job_segments.c.job_id == job_id
                )
            )
            values = {
                "job_id": job_id, "version": version, "attempt": attempt, "state": "pending",
                "prefix": prefix_for(version), "outputs": None, "detail": detail,
                "segments_from": {str(row.segment): row.attempt for row in made},
                "actor": actor, "reserved_at": self.now(conn), "delivered_at": None,
            }  # fmt: skip
            if pending is None:
                conn.execute(insert(job_versions).values(**values))
            else:  # the earlier attempt is fenced out: its writes stop at its next check
                conn.execute(
                    update(job_versions)
                    .where(job_versions.c.job_id == job_id, job_versions.c.version == version)
                    .values(**{k: v for k, v in values.items() if k not in ("job_id", "version")})
                )
            self._event(conn, job_id, job.stage, "version.reserved", attempt, job.trace_id,
                        {"version": version, "prefix": values["prefix"],
                         **({"taken_over_from": pending.attempt} if pending else {})})  # fmt: skip
            return VersionRecord(**values)

    def commit_version(
        self, job_id: str, *, attempt: int, version: int, outputs: dict[str, str]
    ) -> Job:
        """Publish a reserved version whose files are all stored and verified: its record
        becomes `delivered`, the job's current version moves to it and the job is `done`, in
        one transaction. A version is never older than the one it replaces."""
        with self.database.transaction() as conn:
            job = self._held(conn, job_id, attempt)
            if job.stage is not Stage.DELIVER:
                raise self._fenced(conn, job_id, attempt)
            if job.version is not None and version <= job.version:
                raise StaleAttempt(job_id, attempt, f"version {job.version} is published already")
            now = self.now(conn)
            taken = conn.execute(
                update(job_versions)
                .where(job_versions.c.job_id == job_id, job_versions.c.version == version,
                       job_versions.c.attempt == attempt, job_versions.c.state == "pending")
                .values(state="delivered", outputs=outputs, delivered_at=now)
            )  # fmt: skip
            if taken.rowcount != 1:
                raise StaleAttempt(job_id, attempt, f"version {version} is not this attempt's")
            redo = job.progress.get("redo")
            progress = _with_timing(job.progress, job.stage, Stage.DONE, now)
            progress.pop("redo", None)  # done: what it was is in its version's record
            values = {"stage": Stage.DONE.value, "progress": progress, "version": version,
                      "updated_at": now, "heartbeat_at": now, "recoveries": 0}  # fmt: skip
            self._fenced_update(conn, job_id, attempt, values, expected_stage=job.stage)
            if redo:
                self._event(conn, job_id, job.stage, "redo.delivered", attempt, job.trace_id,
                            {"version": version})  # fmt: skip
            self._event(conn, job_id, Stage.DONE, "advanced", attempt, job.trace_id,
                        {"from": job.stage.value, "version": version})  # fmt: skip
            return self._settled(conn, self._read(conn, job_id))
