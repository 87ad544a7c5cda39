"""Idempotent submission: a validated manifest becomes one job per video, in one transaction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from factory.db.state import JobStateMachine
from factory.errors import BadInput, SpecConflict
from factory.job import Job

if TYPE_CHECKING:
    from factory.infra.idempotency import SubmitTokens
    from factory.manifest import Manifest


@dataclass(frozen=True)
class Submitted:
    jobs: list[Job]  # in manifest order
    created: list[str]  # ids created by this call; empty on a resubmission
    fast_path: bool  # answered from the Redis tokens and a read, without a write transaction


def submit(
    manifest: Manifest,
    machine: JobStateMachine,
    tokens: SubmitTokens | None,
    *,
    review_required: bool = False,
    actor: str = "",
) -> Submitted:
    """Create the manifest's jobs. Files named beside the manifest must have been put into the
    store first (`factory.ops.preflight`): a job never refers to a path on the submitting host.
    A new batch requires review if its manifest says `review: required` or the setting
    FACTORY_REVIEW does (``review_required``); an existing batch keeps what it had."""
    from factory.manifest import is_local_path

    for index, video in enumerate(manifest.videos):
        local = [asset for asset in video.assets if is_local_path(asset)]
        if local:
            raise BadInput(
                f"{local[0]} is a path on the submitting host; check and upload the manifest "
                "with factory.ops.preflight before submitting",
                field=f"videos[{index}]",
            )
    hashes = {video.job_id: video.sha256() for video in manifest.videos}
    claims = tokens.claim(hashes) if tokens else None
    if claims and claims.all_seen_before:
        found = machine.find(hashes)
        if all(j in found and found[j].spec_sha256 == h for j, h in hashes.items()):
            return Submitted(jobs=[found[j] for j in hashes], created=[], fast_path=True)
    try:
        with machine.database.transaction() as conn:
            results = machine.create(
                conn,
                manifest.source,
                manifest.videos,
                review=manifest.review or review_required,
                actor=actor,
            )
            for index, result in enumerate(results):
                if not result.created and result.job.spec_sha256 != hashes[result.job.job_id]:
                    raise SpecConflict(result.job.job_id, f"videos[{index}]")
    except BaseException:
        if tokens and claims:
            tokens.release(claims.ours)
        raise
    if tokens:
        tokens.confirm(hashes)
    return Submitted(
        jobs=[r.job for r in results],
        created=[r.job.job_id for r in results if r.created],
        fast_path=False,
    )
