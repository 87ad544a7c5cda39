"""The plan of a redo that swaps scenes' pictures or camera moves (`factory redo JOB --image
1=./product-v2.png`, factory/plan/material.py): the swaps parsed, the new files checked like a
manifest's (factory/ops/preflight.py) and held to the manifest's rules for the family, and the
scenes' segments planned as a range redo. Nothing is written."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from factory.config import Settings
from factory.errors import BadInput
from factory.job import Job
from factory.ops import preflight
from factory.plan.material import (
    MaterialChange,
    described,
    parse_material_change,
    resolved,
    swapped_segments,
)
from factory.plan.redo import RedoPlan
from factory.store import open_store


@dataclasses.dataclass(frozen=True)
class MaterialRedo:
    plan: RedoPlan
    material: dict[str, Any]  # progress.material as the redo leaves it
    uploads: dict[str, Path]  # local files to put into the store by content key


def plan_material_redo(
    job: Job,
    images: Sequence[str],
    cameras: Sequence[str],
    settings: Settings,
    plan_range: Callable[[Job, tuple[int, int], tuple[int, int]], RedoPlan],
    *,
    remote: bool,
) -> MaterialRedo:
    """``plan_range``: the range redo's plan for the job over segments (first, last) that
    deliver output frames [first, end);
    ``remote``: the swap came over the API, so a file on this host is refused, not read."""
    from factory.manifest import material_problems
    from factory.plan.video import video_plan

    changes = [parse_material_change(text, "image") for text in images]
    changes += [parse_material_change(text, "camera") for text in cameras]
    video = job.video
    given: set[tuple[int, str]] = set()
    for change in changes:
        if (change.scene, change.kind) in given:
            raise BadInput(f"scene {change.scene}'s {change.kind} is given twice",
                           field=change.flag)  # fmt: skip
        given.add((change.scene, change.kind))
        if not 0 <= change.scene < len(video.scenes):
            raise BadInput(f"scene {change.scene}: the video has scenes 0-{len(video.scenes) - 1}",
                           field=change.flag)  # fmt: skip
    named = [(f"{c.flag} {c.scene}", c.asset, c.kind) for c in changes if c.asset is not None]
    stored, uploads = ({}, {})
    if named:
        stored, uploads = preflight.check_material(
            named,
            lambda: open_store(settings.store_url, settings.s3),
            confinement=settings.confinement,
            s3=settings.s3,
            allow_local=not remote,
        )
    material = copy.deepcopy(job.progress.get("material") or {})
    said = []
    for change in changes:
        new = resolved(change, video, stored[change.asset] if change.asset else None)
        _check_changes(video, change, new)
        said.append(described(video, change, new))
        material.setdefault(str(change.scene), {})[change.kind] = new
    after = job.video_with_material(material)
    if problems := material_problems(after):
        flag = "--camera" if ".camera" in problems[0].path else "--image"
        raise BadInput(problems[0].message, field=flag)
    plan = plan_range(job, *swapped_segments(video_plan(video), changes))
    return MaterialRedo(dataclasses.replace(plan, material=tuple(said)), material, uploads)


def _check_changes(video: Any, change: MaterialChange, new: dict[str, Any] | None) -> None:
    scene = video.scenes[change.scene]
    old = scene.image if change.kind == "image" else scene.camera
    if (old.to_dict() if old is not None else None) == new:
        having = "has no" if new is None else "already has this"
        raise BadInput(f"scene {change.scene} {having} {change.kind}", field=change.flag)
