"""Swapping a scene's picture or camera move after the video is made (`factory redo JOB
--image 1=./product-v2.png` or `--camera 2=./moves/dolly.mp4,strength=0.6`, docs/jobs.md,
"Swapping a picture or a camera move"): the scene's segments are made again with the new
material (keeping their seeds unless the redo gives one), joined into the untouched rest like
any range redo, and delivered as the next version.

A swap is kept in the job's progress (``progress.material``: ``{"SCENE": {"image": {...} |
null, "camera": {...} | null}}``, only the kinds a redo changed; null removes the scene's
own) and applied to the spec wherever the job's video is read (factory.spec.with_material),
like a changed join. Every redo records the material it ran after (``before.material``), so
making an earlier version's segment again (factory/pipeline/lineage.py) uses the picture it
was made with, not today's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from factory.errors import BadInput
from factory.plan.segments import SegmentPlan
from factory.spec import CAMERA_FITS, IMAGE_ROLES, VideoSpec

KINDS = ("image", "camera")
_CHANGE = re.compile(r"^\s*(\d+)\s*=\s*(.+?)\s*$")
_OPTIONS = {"image": ("as",), "camera": ("strength", "fit")}
FORMS = {
    "image": "SCENE=ASSET[,as=first-frame|reference] or SCENE=none (e.g. 1=./product.png)",
    "camera": "SCENE=ASSET[,strength=0..1][,fit=stretch|loop] or SCENE=none "
    "(e.g. 2=./moves/dolly.mp4,strength=0.6)",
}


@dataclass(frozen=True)
class MaterialChange:
    scene: int  # the manifest's scene (from 0)
    kind: str  # image | camera
    asset: str | None  # None: the scene's own is removed
    options: tuple[tuple[str, str], ...] = ()  # as / strength / fit, as given

    @property
    def flag(self) -> str:
        return f"--{self.kind}"


def parse_material_change(text: str, kind: str) -> MaterialChange:
    """`1=./pic.png,as=reference`, `2=assets/pan.mp4,strength=0.5`, `1=none`: the scene and
    its new material, or exit 2 naming --image / --camera."""
    flag = f"--{kind}"
    match = _CHANGE.match(text)
    if match is None:
        raise BadInput(f"{text!r} is not {FORMS[kind]}", field=flag)
    scene, rest = int(match[1]), match[2]
    asset, *given = (part.strip() for part in rest.split(","))
    options: list[tuple[str, str]] = []
    for part in given:
        name, equals, value = part.partition("=")
        if not equals or name not in _OPTIONS[kind] or not value:
            names = ", ".join(n + "=..." for n in _OPTIONS[kind])
            raise BadInput(f"{text!r}: {part!r} is not one of {names}", field=flag)
        options.append((name, value))
    if len({name for name, _ in options}) != len(options):
        raise BadInput(f"{text!r} gives an option twice", field=flag)
    if not asset:
        raise BadInput(f"{text!r} names no asset: {FORMS[kind]}", field=flag)
    if asset == "none":
        if options:
            raise BadInput(f"{text!r}: `none` removes the scene's {kind}; it takes no options",
                           field=flag)  # fmt: skip
        return MaterialChange(scene, kind, None)
    return MaterialChange(scene, kind, asset, tuple(options))


def resolved(change: MaterialChange, video: VideoSpec, asset: str | None) -> dict[str, Any] | None:
    """The scene's new material as the spec stores it: the options given, else the scene's
    own (a swapped picture keeps its role, a camera move its strength and fit), else the
    manifest's defaults; ``asset``: the change's asset as the store names it."""
    if asset is None:
        return None
    flag, scene = change.flag, video.scenes[change.scene]
    options = dict(change.options)
    if change.kind == "image":
        role = options.get("as") or (scene.image.role if scene.image else "first-frame")
        if role not in IMAGE_ROLES:
            raise BadInput(f"as={role!r} is not one of {', '.join(IMAGE_ROLES)}", field=flag)
        return {"asset": asset, "as": role}
    now = scene.camera
    try:
        strength = float(options["strength"]) if "strength" in options else (
            now.strength if now else 1.0)  # fmt: skip
    except ValueError:
        raise BadInput(f"strength={options['strength']!r} is not a number", field=flag) from None
    if not 0 <= strength <= 1:
        raise BadInput(f"strength={strength:g} is outside 0 to 1", field=flag)
    fit = options.get("fit") or (now.fit if now else "stretch")
    if fit not in CAMERA_FITS:
        raise BadInput(f"fit={fit!r} is not one of {', '.join(CAMERA_FITS)}", field=flag)
    return {"asset": asset, "strength": strength, "fit": fit}


def described(video: VideoSpec, change: MaterialChange, new: dict[str, Any] | None) -> dict:
    """The change for people and the version's record: scene, kind, from, to."""
    scene = video.scenes[change.scene]
    old = scene.image if change.kind == "image" else scene.camera
    return {"scene": change.scene, "kind": change.kind,
            "from": _said(old.to_dict() if old else None), "to": _said(new)}  # fmt: skip


def _said(material: dict[str, Any] | None) -> str:
    if material is None:
        return "none"
    extra = [f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
             for k, v in material.items() if k != "asset"]  # fmt: skip
    return material["asset"] + (f" ({', '.join(extra)})" if extra else "")


def swapped_segments(
    plans: Sequence[SegmentPlan], changes: Sequence[MaterialChange]
) -> tuple[tuple[int, int], tuple[int, int]]:
    """The first and last segment that take the changed scenes' material (each segment takes
    its scene's, the scene its first new frame falls in; a shot's run-on past a cut is its
    last scene's too), and the output frames [first, end) they deliver: what the redo makes
    again. Refused (exit 2) where the scenes are not next to each other, or a scene has no
    segment of its own (its material is never used)."""
    scenes = sorted({c.scene for c in changes})
    flag = changes[0].flag
    if scenes != list(range(scenes[0], scenes[-1] + 1)):
        raise BadInput(f"scenes {', '.join(map(str, scenes))} are not next to each other: swap "
                       "their material in a redo each, so the scenes between are not made "
                       "again", field=flag)  # fmt: skip
    for scene in scenes:
        if not any(p.scene == scene for p in plans):
            raise BadInput(f"scene {scene} is shorter than a segment's new frames, so every "
                           "segment over it takes the material of the scene before: a swap "
                           "there would change nothing", field=flag)  # fmt: skip
    own = [p for p in plans if p.scene in scenes]
    end = max(p.write_start + p.owned_count for p in own)
    return (own[0].index, own[-1].index), (own[0].write_start, end)
