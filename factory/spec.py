"""The resolved job spec: every setting explicit, in one canonical JSON form with a stable hash.

A job is one output video. Its spec is what the manifest said for that video after
defaults were applied; two submissions describe the same job exactly when their canonical
JSON is byte-identical. A single ``prompt`` is stored as one scene covering the whole
video, so ``prompt: X`` and ``scenes: [{start: 0, prompt: X}]`` are the same spec.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

SPEC_VERSION = 1
DIFFUSERS_FAMILIES = ("skyreels-v2-df", "wan", "ltx-video", "helios", "anyflow-far")
# Families whose segments continue from the previous segment's latents (docs/models.md): their
# overlap is re-decoded, not regenerated, so their first segment is `overlap` frames shorter.
LATENT_FAMILIES = ("helios", "anyflow-far")
CPU_FAMILIES = ("procedural", "timed")
MODEL_FAMILIES = CPU_FAMILIES + DIFFUSERS_FAMILIES
KEYFRAME_LAYOUTS = ("every-2s", "segments")
DEFAULT_KEYFRAMES = "every-2s"


CONTINUE, CUT = "continue", "cut"
# The transitions a scene may join the one before with (docs/manifest.md), each the name of
# the ffmpeg `xfade` transition that blends them.
TRANSITIONS = {
    "dissolve": "fade",
    "fade-black": "fadeblack",
    "fade-white": "fadewhite",
    "wipe-left": "wipeleft",
    "wipe-right": "wiperight",
    "wipe-up": "wipeup",
    "wipe-down": "wipedown",
    "slide-left": "slideleft",
    "slide-right": "slideright",
}
TRANSITION_SECONDS = (0.5, 3.0)
# Seconds the shot before a cut or a transition runs on past its end, at least: frames never
# shown at a cut, made so that a redo can turn the cut into a transition of up to this length
# (or lengthen a shorter one) without making a segment again (docs/jobs.md, "Changing a join").
DEFAULT_RUN_ON = 1.0


MAX_SEED = 2**32 - 1  # one rule for manifests, redos (CLI and API): what generators take
MAX_PROMPT_CHARS = 2000
IMAGE_ROLES = ("first-frame", "reference")
# The families that can use each kind of picture (docs/manifest.md, "Images").
IMAGE_FAMILIES = {
    "first-frame": ("procedural", "skyreels-v2-df", "wan", "ltx-video", "helios", "anyflow-far"),
    "reference": ("procedural", "wan"),
}
IMAGE_FITS = ("pad", "crop")
DEFAULT_IMAGE_FIT = "pad"


@dataclass(frozen=True)
class SceneImage:
    """A picture a scene brings (docs/manifest.md, "Images"): `first-frame` starts the
    scene's shot from it; `reference` conditions every segment of the scene on it."""

    asset: str  # store URL (file://, s3://) or a key in the factory's store
    role: str = "first-frame"

    def to_dict(self) -> dict[str, Any]:
        return {"asset": self.asset, "as": self.role}


CAMERA_FITS = ("stretch", "loop")
# The families that can follow a camera-move template (docs/manifest.md, "Camera moves").
CAMERA_FAMILIES = ("procedural", "wan", "ltx-video")


@dataclass(frozen=True)
class CameraMove:
    """A camera-move template a scene follows: a short video of the move (or of its depth
    or flow rendering), `strength` 0..1, `stretch`ed over the scene or `loop`ed."""

    asset: str  # store URL (file://, s3://) or a key in the factory's store
    strength: float = 1.0
    fit: str = "stretch"

    def to_dict(self) -> dict[str, Any]:
        return {"asset": self.asset, "strength": self.strength, "fit": self.fit}


@dataclass(frozen=True)
class Scene:
    start: float  # seconds
    end: float  # seconds, exclusive
    prompt: str
    # How it joins the scene before: continue (the same shot), cut (a new shot), or a
    # transition's name (a new shot, blended in over `transition_seconds`).
    join: str = CONTINUE
    transition_seconds: float = 0.0
    # Frames the shot before runs on past this scene's start, where a redo changed the join
    # (factory/plan/rejoin.py): what that shot was made with; never stored in the spec.
    # None: the larger of the transition and the video's `run_on` (run_on_frames).
    made_run_on: int | None = None
    image: SceneImage | None = None  # a first frame or a reference picture
    camera: CameraMove | None = None  # a camera move it follows

    def to_dict(self) -> dict[str, Any]:
        """As the spec stores it: `join` only where it is not `continue`, `image` only where
        given, so specs made before either existed keep their hash (and seed and id)."""
        data: dict[str, Any] = {"start": self.start, "end": self.end, "prompt": self.prompt}
        if self.join in TRANSITIONS:
            data["join"] = {"transition": self.join, "seconds": self.transition_seconds}
        elif self.join != CONTINUE:
            data["join"] = self.join
        if self.image is not None:
            data["image"] = self.image.to_dict()
        if self.camera is not None:
            data["camera"] = self.camera.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Scene:
        join = data.get("join", CONTINUE)
        found = data.get("image")
        image = SceneImage(found["asset"], found.get("as", "first-frame")) if found else None
        moved = data.get("camera")
        camera = (CameraMove(moved["asset"], float(moved.get("strength", 1.0)),
                             moved.get("fit", "stretch")) if moved else None)  # fmt: skip
        if isinstance(join, dict):
            return cls(data["start"], data["end"], data["prompt"], join["transition"],
                       float(join["seconds"]), image=image, camera=camera)  # fmt: skip
        return cls(data["start"], data["end"], data["prompt"], join, image=image, camera=camera)


@dataclass(frozen=True)
class LoraChoice:
    asset: str  # a .safetensors LoRA: store URL (s3://, file://) or a key in the store
    scale: float = 1.0  # how strongly it applies (0: not at all)


@dataclass(frozen=True)
class ModelChoice:
    family: str
    path: str | None = None  # local model directory, diffusers families only
    seconds_per_segment: float | None = None  # timed family only
    steps: int | None = None  # diffusers families: denoising steps
    guidance: float | None = None  # diffusers families: classifier-free guidance scale
    loras: tuple[LoraChoice, ...] = ()  # diffusers families: adapters over the base weights


@dataclass(frozen=True)
class SoundCue:
    """A sound effect mixed over the bed from `at` seconds on (docs/manifest.md, "Sound")."""

    at: float  # seconds from the video's start; cut at the video's end
    asset: str  # store URL (file://, s3://) or a key in the factory's store
    gain_db: float = 0.0


# Delivery profiles: integrated loudness (LUFS) and true-peak ceiling (dBTP).
LOUDNESS_PROFILES = {"streaming": (-14.0, -1.0), "broadcast": (-23.0, -1.0)}


@dataclass(frozen=True)
class Loudness:
    """The loudness the track is normalised to and the gate holds it to."""

    integrated: float  # LUFS
    true_peak: float  # dBTP, the ceiling
    profile: str | None = None  # the delivery profile it came from, if any


@dataclass(frozen=True)
class AudioChoice:
    asset: str | None  # the bed: store URL (file://, s3://) or a store key; None: silence
    gain_db: float = 0.0
    loop: bool = True  # shorter assets loop to length; otherwise silence pads the end
    cues: tuple[SoundCue, ...] = ()  # mixed over the bed at their times
    loudness: Loudness | None = None  # normalised to this and checked; None: as mixed

    def to_dict(self) -> dict[str, Any]:
        """As the spec stores it: cues and loudness only where given, so a spec made before
        they existed keeps its hash."""
        data: dict[str, Any] = {"asset": self.asset, "gain_db": self.gain_db, "loop": self.loop}
        if self.cues:
            data["cues"] = [asdict(cue) for cue in self.cues]
        if self.loudness is not None:
            data["loudness"] = asdict(self.loudness)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AudioChoice:
        loudness = data.get("loudness")
        return cls(
            data["asset"], float(data.get("gain_db", 0.0)), bool(data.get("loop", True)),
            tuple(SoundCue(float(c["at"]), c["asset"], float(c.get("gain_db", 0.0)))
                  for c in data.get("cues", ())),
            Loudness(float(loudness["integrated"]), float(loudness["true_peak"]),
                     loudness.get("profile")) if loudness else None,
        )  # fmt: skip


@dataclass(frozen=True)
class VideoSpec:
    batch: str
    video_id: str
    duration: float
    fps: int
    width: int
    height: int
    seed: int
    scenes: tuple[Scene, ...]
    negative_prompt: str
    model: ModelChoice
    segment_frames: int
    segment_overlap: int
    renditions: tuple[str, ...]
    audio: AudioChoice | None
    # Where encoded GOPs start (factory/plan/chunks.py): `every-2s` from each chunk's
    # start, or `segments`: at every segment's first frame too, so a redo replaces whole GOPs.
    keyframes: str = DEFAULT_KEYFRAMES
    # At least this many seconds made past the end of a shot that a cut or transition ends.
    run_on: float = DEFAULT_RUN_ON
    # How a scene's picture is brought to the frame size: pad (fit, black bars) or crop.
    image_fit: str = DEFAULT_IMAGE_FIT

    @property
    def job_id(self) -> str:
        return job_id_for(self.batch, self.video_id)

    @property
    def frames_total(self) -> int:
        return frames_for(self.duration, self.fps)

    @property
    def first_segment_short(self) -> int:
        """How many frames fewer segment 0 generates (factory.plan.segments: latent families)."""
        return self.segment_overlap if self.model.family in LATENT_FAMILIES else 0

    @property
    def assets(self) -> tuple[str, ...]:
        """Files the job reads from the store besides its own work: the asset cache warms them."""
        loras = tuple(lora.asset for lora in self.model.loras)
        images = tuple(dict.fromkeys(
            [s.image.asset for s in self.scenes if s.image is not None]
            + [s.camera.asset for s in self.scenes if s.camera is not None]
        ))  # fmt: skip
        if self.audio is None:
            return loras + images
        bed = (self.audio.asset,) if self.audio.asset else ()
        return loras + images + bed + tuple(dict.fromkeys(c.asset for c in self.audio.cues))

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec_version": SPEC_VERSION,
            "batch": self.batch,
            "video_id": self.video_id,
            "duration": float(self.duration),
            "fps": self.fps,
            "width": self.width,
            "height": self.height,
            "seed": self.seed,
            "scenes": [s.to_dict() for s in self.scenes],
            "negative_prompt": self.negative_prompt,
            # unset fields stay out, so specs made before a field existed keep their hash
            "model": {k: v for k, v in asdict(self.model).items() if v not in (None, ())},
            "segment": {"frames": self.segment_frames, "overlap": self.segment_overlap},
            "renditions": list(self.renditions),
            "audio": self.audio.to_dict() if self.audio else None,
            **({"keyframes": self.keyframes} if self.keyframes != DEFAULT_KEYFRAMES else {}),
            **({"run_on": self.run_on} if self.run_on != DEFAULT_RUN_ON else {}),
            **({"image_fit": self.image_fit} if self.image_fit != DEFAULT_IMAGE_FIT else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VideoSpec:
        if data.get("spec_version") != SPEC_VERSION:
            raise ValueError(f"unsupported spec_version {data.get('spec_version')!r}")
        audio = data["audio"]
        return cls(
            batch=data["batch"],
            video_id=data["video_id"],
            duration=float(data["duration"]),
            fps=int(data["fps"]),
            width=int(data["width"]),
            height=int(data["height"]),
            seed=int(data["seed"]),
            scenes=tuple(Scene.from_dict(s) for s in data["scenes"]),
            negative_prompt=data["negative_prompt"],
            model=_model(data["model"]),
            segment_frames=int(data["segment"]["frames"]),
            segment_overlap=int(data["segment"]["overlap"]),
            renditions=tuple(data["renditions"]),
            audio=AudioChoice.from_dict(audio) if audio else None,
            keyframes=data.get("keyframes", DEFAULT_KEYFRAMES),
            run_on=float(data.get("run_on", DEFAULT_RUN_ON)),
            image_fit=data.get("image_fit", DEFAULT_IMAGE_FIT),
        )

    def canonical_json(self) -> str:
        return canonical_json(self.to_dict())

    def sha256(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def job_id_for(batch: str, video_id: str) -> str:
    # Ids allow [A-Za-z0-9_-] only, so the dot separates batch and video unambiguously.
    return f"{batch}.{video_id}"


def frames_for(duration: float, fps: int) -> int:
    return round(duration * fps)


def transition_frames(scene: Scene, fps: int) -> int:
    """The frames of the transition into `scene` (0 for continue and cut)."""
    return round(scene.transition_seconds * fps) if scene.join in TRANSITIONS else 0


def run_on_frames(video: VideoSpec, scene: Scene, shot_frames: int) -> int:
    """The frames the shot before `scene` makes past its end, where `scene` starts a shot of
    `shot_frames`: none where the scene continues it; else the transition's or the video's
    `run_on`, the larger, but never past the new shot's end (a redo that changed the join
    keeps what the shot before was made with)."""
    if scene.join == CONTINUE:
        return 0
    if scene.made_run_on is not None:
        return scene.made_run_on
    wanted = max(transition_frames(scene, video.fps), round(video.run_on * video.fps))
    return min(wanted, shot_frames)


def derived_seed(scenes: tuple[Scene, ...], negative_prompt: str) -> int:
    text = canonical_json([[s.to_dict() for s in scenes], negative_prompt])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")


def derived_video_id(content: dict[str, Any]) -> str:
    """An id for a video the manifest left unnamed: the hash of its content, batch excluded."""
    digest = hashlib.sha256(canonical_json(content).encode()).hexdigest()
    return f"v-{digest[:12]}"


def _model(data: dict[str, Any]) -> ModelChoice:
    loras = tuple(LoraChoice(**lora) for lora in data.get("loras", ()))
    return ModelChoice(**{**data, "loras": loras})


def run_ons(video: VideoSpec) -> list[int]:
    """Per scene, the frames the shot before it makes past its end (run_on_frames; 0 where
    the scene continues that shot)."""
    starts = [round(scene.start * video.fps) for scene in video.scenes]  # (segments.py's rule)
    shot_starts = [i for i, scene in enumerate(video.scenes) if scene.join != CONTINUE]
    made = [0] * len(video.scenes)
    for scene, following in itertools.pairwise([*shot_starts, None]):
        end = starts[following] if following is not None else video.frames_total
        made[scene] = run_on_frames(video, video.scenes[scene], end - starts[scene])
    return made


def with_joins(video: VideoSpec, joins: Mapping[str, Any] | None) -> VideoSpec:
    """The spec with the joins between shots a redo changed (``progress.joins``,
    factory/plan/rejoin.py) in place of the manifest's, each keeping the run-on the shot
    before it was made with, so the video's segments stay as they were. ValueError, KeyError
    or TypeError for an entry that is not such a join."""
    if not joins:
        return video
    made = run_ons(video)
    scenes = list(video.scenes)
    for key, entry in joins.items():
        scene = int(key)
        if not 0 < scene < len(made) or video.scenes[scene].join == CONTINUE:
            raise ValueError(f"scene {scene} starts no shot")
        join = entry["join"]
        if join != CUT and join not in TRANSITIONS:
            raise ValueError(f"scene {scene}: {join!r} is not cut or a transition")
        seconds = float(entry["seconds"]) if join != CUT else 0.0
        scenes[scene] = replace(
            scenes[scene], join=join, transition_seconds=seconds, made_run_on=made[scene]
        )
    return replace(video, scenes=tuple(scenes))


def with_material(video: VideoSpec, material: Mapping[str, Any] | None) -> VideoSpec:
    """The spec with the pictures and camera moves a redo swapped (``progress.material``,
    factory/plan/material.py) in place of the manifest's: per scene, `image` and `camera`
    where given (null: removed). ValueError, KeyError or TypeError for an entry that is not
    such material, or that names a file on some host rather than store content."""
    if not material:
        return video
    scenes = list(video.scenes)
    for key, entry in material.items():
        scene = int(key)
        if not 0 <= scene < len(scenes) or not set(entry) <= {"image", "camera"}:
            raise ValueError(f"scene {key}: {sorted(entry)} is not image and camera material")
        changed = {}
        if "image" in entry:
            found = entry["image"]
            changed["image"] = (SceneImage(_stored_asset(found["asset"]), found["as"])
                                if found is not None else None)  # fmt: skip
            if found is not None and found["as"] not in IMAGE_ROLES:
                raise ValueError(f"scene {scene}: {found['as']!r} is not a picture's role")
        if "camera" in entry:
            moved = entry["camera"]
            changed["camera"] = (CameraMove(_stored_asset(moved["asset"]),
                                            float(moved["strength"]), moved["fit"])
                                 if moved is not None else None)  # fmt: skip
            if moved is not None and (moved["fit"] not in CAMERA_FITS
                                      or not 0 <= float(moved["strength"]) <= 1):  # fmt: skip
                raise ValueError(f"scene {scene}: {moved!r} is not a camera move")
        scenes[scene] = replace(scenes[scene], **changed)
    return replace(video, scenes=tuple(scenes))


def _stored_asset(asset: Any) -> str:
    """A swapped asset as the database holds it (which is not trusted: docs/security.md),
    held to the manifest's rule for an asset reference, and never a path on some host."""
    if not isinstance(asset, str) or not asset or is_local_path(asset) or len(asset) > 1024:
        raise ValueError(f"{asset!r} is not store content")
    return asset_reference(asset)


def is_local_path(reference: str) -> bool:
    """`./beds/calm.ogg`: a file in the manifest's folder (or below it), put into the store
    (content-addressed) when the manifest is submitted."""
    return reference.startswith("./")


def asset_reference(value: str) -> str:
    """The rule for an asset reference: ./path, file://, s3:// or a store key, never
    climbing out with '..' and never a host path; the value, or ValueError."""
    if "://" in value:
        scheme = value.split("://", 1)[0]
        if scheme not in ("file", "s3"):
            raise ValueError(
                f"scheme {scheme!r} is not supported; use ./path, file://, s3:// or a store key"
            )
    elif ".." in value.split("/"):
        raise ValueError(f"{value!r} must not climb out: a path or key without '..'")
    elif is_local_path(value):
        if value.endswith("/"):
            raise ValueError(f"{value!r} names a folder; name the file")
    elif value.startswith("/"):
        raise ValueError(
            f"{value!r} must be a path in the manifest's folder (./…), a store URL "
            "(file://, s3://) or a store key"
        )
    return value
