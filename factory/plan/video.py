"""A video's plan as the workers follow it: its segments (planned once per shape), the scene
each one belongs to, the next segment a job makes and what one call made. Pure: no store, no
database."""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

from factory.job import Job
from factory.plan.redo import given
from factory.plan.segments import SegmentPlan, scene_start_frames
from factory.plan.shots import Join, ShotPlan, plan_shots
from factory.spec import IMAGE_FAMILIES, SceneImage, VideoSpec, run_ons, transition_frames


def video_plan(video: VideoSpec) -> list[SegmentPlan]:
    """Every segment of the video, shot after shot, numbered through the video."""
    return [s for shot in video_shots(video) for s in shot.segments]


def video_shots(video: VideoSpec) -> list[ShotPlan]:
    starts = tuple(scene_start_frames([s.start for s in video.scenes], video.fps))
    joins = tuple(Join(s.join, transition_frames(s, video.fps)) for s in video.scenes)
    shape = (video.frames_total, video.segment_frames, video.segment_overlap)
    return list(_plan(*shape, starts, joins, video.first_segment_short, tuple(run_ons(video))))


@functools.lru_cache(maxsize=64)
def _plan(frames: int, length: int, overlap: int, starts: tuple[int, ...],
          joins: tuple[Join, ...], short: int, run_ons: tuple[int, ...],
          ) -> tuple[ShotPlan, ...]:  # fmt: skip
    """Planned once per process and video shape: the segment path asks for it several times
    per segment, and a 3,000-segment plan takes milliseconds to make."""
    return tuple(plan_shots(frames, length, overlap, starts, joins, short, run_ons))


def scene_ids(job: Job) -> list[int]:
    """Each segment's scene for the seam and drift checks: the manifest's scenes, where a
    redo's new prompt starts a scene of its own (it may look different on purpose)."""
    prompts = job.progress.get("prompts")
    ids: list[int] = []
    last: tuple[int, str | None] | None = None
    for plan in video_plan(job.video):
        key = (plan.scene, given(prompts, plan.index))
        ids.append(ids[-1] + (key != last) if ids else 0)
        last = key
    return ids


def scene_change(job: Job, plans: list[SegmentPlan], index: int) -> bool:
    """Whether segment ``index`` starts another scene than the segment before it's (as
    scene_ids numbers them), from those two segments alone: asked at every seam."""
    return scene_change_at(job.progress.get("prompts"), plans, index)


def scene_change_at(prompts: Any, plans: list[SegmentPlan], index: int) -> bool:
    """scene_change, from the prompts a job's redos gave (progress.prompts)."""
    if index == 0:
        return False
    before, after = plans[index - 1], plans[index]
    return (before.scene, given(prompts, index - 1)) != (after.scene, given(prompts, index))


def next_segment(job: Job, shot: int | None = None) -> SegmentPlan | None:
    """The first segment not yet made: of the video, or of shot `shot`."""
    done = set(job.progress["segments"])
    plans = video_plan(job.video)
    return next((p for p in plans if p.index not in done and shot in (None, p.shot)), None)


def open_shots(job: Job) -> list[int]:
    """The shots with a segment still to make, in order."""
    done = set(job.progress["segments"])
    return sorted({p.shot for p in video_plan(job.video) if p.index not in done})


def segments_made(before: Job, after: Job) -> set[int]:
    """The segments whose files one `make_segment` call made: the new one, and the segment a
    redo joins into when its last redone segment was made (it stays recorded throughout)."""
    made = set(after.progress["segments"]) - set(before.progress["segments"])
    redo = after.progress.get("redo")
    if redo and redo.get("join") is not None and redo["segments"][-1] in made:
        made.add(int(redo["join"]))
    return made


def shown_seams(plans: list[SegmentPlan]) -> set[int]:
    """The seams the contact sheet has a row for: those between two segments that each
    deliver frames of their own (a run-on into a transition is blended, never shown alone).
    Its rows: these seams in order, then a row per join between shots (`joins`)."""
    return {
        p.index
        for p in plans[1:]
        if not p.starts_shot and p.owned_count and plans[p.index - 1].owned_count
    }


def joins(plans: list[SegmentPlan]) -> list[int]:
    """The segments that start a shot after the first: where a cut or a transition is."""
    return [p.index for p in plans if p.index and p.starts_shot]


def picture_for(video: VideoSpec, plan: SegmentPlan) -> SceneImage | None:
    """The picture a segment is given (factory/generate/base.py, SegmentSpec.image), with
    the role it plays there: its scene's reference picture; its scene's first frame where
    the segment starts the shot; for the scene's later segments, that first frame as their
    reference where the family can use one (what keeps a product recognisable after the
    first segment), else nothing (they continue from the segment before)."""
    image = video.scenes[plan.scene].image
    if image is None or image.role == "reference" or plan.starts_shot:
        return image
    if video.model.family in IMAGE_FAMILIES["reference"]:
        return replace(image, role="reference")
    return None


def template_frames(video: VideoSpec, plan: SegmentPlan, length: int) -> list[float] | None:
    """Where in its scene's camera-move template (`length` frames at the video's fps) each of
    the segment's generated frames is, in template frames (fractional where the template is
    stretched: its motion is followed smoothly, its nearest frame shown), or None without
    one. `stretch` maps the scene's frames onto the whole template (frame i of L: template
    position i x (length - 1) / (L - 1)), `loop` repeats it (i mod length); a segment's
    frames past its scene's end keep going (the last template frame when stretched, the loop
    when looped). A resumed segment gets the same: this is arithmetic on the plan alone."""
    scene = video.scenes[plan.scene]
    if scene.camera is None:
        return None
    start = round(scene.start * video.fps)
    frames = max(2, round(scene.end * video.fps) - start)
    found: list[float] = []
    for offset in range(plan.frames):
        i = max(0, plan.first_frame + offset - start)
        if scene.camera.fit == "loop":
            found.append(float(i % length))
        else:
            found.append(min(float(length - 1), i * (length - 1) / (frames - 1)))
    return found
