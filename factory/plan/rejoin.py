"""Changing how a shot joins the one before, after the video is made (`factory redo JOB
--join 2=dissolve:1.5`, docs/jobs.md, "Changing a join"): a cut becomes a transition, a
transition a cut or another transition, and nothing is generated again.

That works because the segments never depend on a join's kind: at every cut and transition
the shot before runs on past its end (factory/plan/shots.py, `run_ons`), so the frames a
transition blends in are already made; a cut leaves them out. A changed join is kept in
the job's progress (``progress.joins``: ``{"SCENE": {"join": "cut"}}`` or ``{"SCENE":
{"join": NAME, "seconds": S}}``) and applied to the spec wherever the job's video is read
(factory.spec.with_joins), with the run-on the shot before was made with, so the plan stays the same
segment for segment. Only the chunk that starts the shot changes (its name says which
transition it blends, factory/pipeline/files.py) and is encoded and checked again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from factory.errors import BadInput
from factory.spec import CONTINUE, CUT, TRANSITION_SECONDS, TRANSITIONS, VideoSpec

_CHANGE = re.compile(r"^\s*(\d+)\s*=\s*([a-z-]+)(?::(\d+(?:\.\d+)?))?\s*$")
FORMS = "SCENE=cut or SCENE=TRANSITION:SECONDS (e.g. 2=cut, 2=dissolve:1.5)"


@dataclass(frozen=True)
class JoinChange:
    scene: int  # the manifest's scene (from 0) whose join changes
    join: str  # cut, or a transition's name
    seconds: float = 0.0  # a transition's length

    def to_dict(self) -> dict[str, Any]:
        return {"join": self.join, **({"seconds": self.seconds} if self.join != CUT else {})}

    def describe(self) -> str:
        return self.join if self.join == CUT else f"{self.join} {self.seconds:g} s"


def parse_join_change(text: str) -> JoinChange:
    """`2=cut`, `2=dissolve:1.5`: the scene and its new join, or exit 2 naming --join."""
    match = _CHANGE.match(text)
    if match is None:
        raise BadInput(f"{text!r} is not {FORMS}", field="--join")
    scene, join, seconds = int(match[1]), match[2], match[3]
    if join == CUT:
        if seconds is not None:
            raise BadInput(f"{text!r}: a cut has no length; give {scene}=cut", field="--join")
        return JoinChange(scene, CUT)
    if join not in TRANSITIONS:
        raise BadInput(
            f"{join!r} is not a join a redo can give: use cut or one of {', '.join(TRANSITIONS)}"
            + ("; `continue` would make the shot again from the one before" if join == CONTINUE
               else ""),
            field="--join",
        )  # fmt: skip
    low, high = TRANSITION_SECONDS
    if seconds is None:
        raise BadInput(f"{text!r}: give the transition's length, {scene}={join}:1",
                       field="--join")  # fmt: skip
    if not low <= float(seconds) <= high:
        raise BadInput(f"{text!r}: {seconds} s is outside {low:g} to {high:g} s", field="--join")
    return JoinChange(scene, join, float(seconds))


def check_join_change(video: VideoSpec, change: JoinChange) -> str:
    """Refuses (exit 2 naming --join) a change the frames already made cannot give; returns
    the join it replaces, for people ("cut", "dissolve 1.5 s")."""
    from factory.plan.video import video_shots

    shots = video_shots(video)
    starts = {shot.scenes[0]: shot for shot in shots[1:]}
    count = len(video.scenes)
    if not 0 <= change.scene < count:
        raise BadInput(f"scene {change.scene}: the video has scenes 0-{count - 1}",
                       field="--join")  # fmt: skip
    shot = starts.get(change.scene)
    if shot is None:
        raise BadInput(
            f"scene {change.scene} continues the shot before it: a redo changes a cut or a "
            "transition, never where a shot starts (that makes the shots again: change the "
            "manifest and submit it)" + ("; shots start at scenes "
            + ", ".join(map(str, sorted(starts))) if starts else ""),
            field="--join",
        )  # fmt: skip
    scene = video.scenes[change.scene]
    now = CUT if scene.join == CUT else f"{scene.join} {scene.transition_seconds:g} s"
    if (scene.join, scene.transition_seconds if scene.join != CUT else 0.0) == (
        change.join,
        change.seconds,
    ):
        raise BadInput(f"scene {change.scene} already joins by {now}", field="--join")
    frames = round(change.seconds * video.fps)
    made = shots[shot.index - 1].run_on
    if frames > made:
        raise BadInput(
            f"scene {change.scene}: a {change.seconds:g} s {change.join} blends {frames} "
            f"frames of the shot before, which ran on {made} frames ({made / video.fps:g} s) "
            f"past its end; give at most {made / video.fps:g} s, or a larger `run_on` in the "
            "manifest and submit it again",
            field="--join",
        )
    if frames > shot.end - shot.start:
        raise BadInput(
            f"scene {change.scene}: its shot is {shot.end - shot.start} frames, shorter than "
            f"the {frames}-frame {change.join}",
            field="--join",
        )
    return now
