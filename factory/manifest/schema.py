"""The manifest's schema: its limits and the pydantic models of a batch, a video, its scenes,
segment, model, LoRAs and audio, each field checked where it is read (docs/manifest.md)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    field_validator,
    model_validator,
)

from factory.spec import (
    CAMERA_FITS,
    DEFAULT_IMAGE_FIT,
    DEFAULT_KEYFRAMES,
    DEFAULT_RUN_ON,
    DIFFUSERS_FAMILIES,
    IMAGE_FITS,
    IMAGE_ROLES,
    KEYFRAME_LAYOUTS,
    LOUDNESS_PROFILES,
    MAX_PROMPT_CHARS,
    MAX_SEED,
    MODEL_FAMILIES,
    TRANSITION_SECONDS,
    asset_reference,
)

MAX_MANIFEST_BYTES = 1024 * 1024
MAX_VIDEOS = 100
MAX_DURATION_S = 600.0
MAX_FPS = 60
MIN_SIDE, MAX_SIDE = 64, 3840
MAX_PIXELS = 3840 * 2160
SIDE_MULTIPLE = 8
MAX_SCENES = 200
MAX_SEGMENT_FRAMES = 1024
MAX_SECONDS_PER_SEGMENT = 3600.0
MAX_LORAS = 4
MAX_CUES = 200
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,47}$"
RENDITIONS = ("master", "mobile", "compat")
DEFAULT_RENDITIONS = RENDITIONS

_ID_RULE = "must be 1-48 characters of A-Z a-z 0-9 _ - starting with a letter or digit"


def _check_id(value: str) -> str:
    if not re.fullmatch(ID_PATTERN, value):
        raise ValueError(f"{value!r} {_ID_RULE}")
    return value


SafeId = Annotated[str, AfterValidator(_check_id)]
Prompt = Annotated[str, Field(min_length=1, max_length=MAX_PROMPT_CHARS)]
Seconds = Annotated[float, Field(ge=0, le=MAX_DURATION_S, allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Resolution(_Strict):
    width: StrictInt = Field(ge=MIN_SIDE, le=MAX_SIDE, multiple_of=SIDE_MULTIPLE)
    height: StrictInt = Field(ge=MIN_SIDE, le=MAX_SIDE, multiple_of=SIDE_MULTIPLE)

    @model_validator(mode="before")
    @classmethod
    def _from_text_or_pair(cls, value: Any) -> Any:
        if isinstance(value, str):
            match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", value)
            if not match:
                raise ValueError(f"{value!r} must be WIDTHxHEIGHT, e.g. 1280x720")
            return {"width": int(match[1]), "height": int(match[2])}
        if isinstance(value, list):
            if len(value) != 2:
                raise ValueError("must be [width, height]")
            return {"width": value[0], "height": value[1]}
        return value

    @model_validator(mode="after")
    def _pixel_budget(self) -> Resolution:
        if self.width * self.height > MAX_PIXELS:
            raise ValueError(f"{self.width}x{self.height} is more pixels than 3840x2160")
        return self


DEFAULT_SEGMENT_FRAMES, DEFAULT_SEGMENT_OVERLAP = 16, 4  # families without their own


class SegmentSettings(_Strict):
    """What the manifest says; a setting left out comes from the model family (or the
    defaults above), and the overlap-at-most-half rule is checked on the result."""

    frames: StrictInt | None = Field(default=None, ge=2, le=MAX_SEGMENT_FRAMES)
    overlap: StrictInt | None = Field(default=None, ge=0, le=MAX_SEGMENT_FRAMES - 1)


class LoraSettings(_Strict):
    asset: str = Field(min_length=1, max_length=1024)
    scale: float = Field(default=1.0, ge=-4, le=4, allow_inf_nan=False)

    @field_validator("asset")
    @classmethod
    def _reference(cls, value: str) -> str:
        if not value.endswith(".safetensors"):
            raise ValueError(f"{value!r} must be a .safetensors file (a LoRA as trainers save it)")
        return asset_reference(value)


class ModelSettings(_Strict):
    family: Literal[MODEL_FAMILIES]  # type: ignore[valid-type]
    path: str | None = Field(default=None, min_length=1, max_length=4096)
    seconds_per_segment: float | None = Field(
        default=None, gt=0, le=MAX_SECONDS_PER_SEGMENT, allow_inf_nan=False
    )
    steps: StrictInt | None = Field(default=None, ge=1, le=200)
    guidance: float | None = Field(default=None, ge=0, le=30, allow_inf_nan=False)
    lora: list[LoraSettings] | None = Field(default=None, min_length=1, max_length=MAX_LORAS)

    @model_validator(mode="before")
    @classmethod
    def _family_shorthand(cls, value: Any) -> Any:
        return {"family": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _fields_fit_family(self) -> ModelSettings:
        diffusers = self.family in DIFFUSERS_FAMILIES
        if diffusers and not self.path:
            raise ValueError(f"family {self.family} needs `path`: the local model directory")
        if diffusers and not self.path.startswith("/"):  # type: ignore[union-attr]
            raise ValueError(f"path {self.path!r} must be an absolute directory path")
        if not diffusers and self.path is not None:
            raise ValueError(f"family {self.family} takes no `path`")
        if self.family == "timed" and self.seconds_per_segment is None:
            raise ValueError("family timed needs `seconds_per_segment`")
        if self.family != "timed" and self.seconds_per_segment is not None:
            raise ValueError(f"family {self.family} takes no `seconds_per_segment`")
        if not diffusers and (self.steps is not None or self.guidance is not None):
            raise ValueError(f"family {self.family} takes no `steps` or `guidance`")
        if not diffusers and self.lora is not None:
            raise ValueError(f"family {self.family} takes no `lora`")
        if self.lora and len({lora.asset for lora in self.lora}) != len(self.lora):
            raise ValueError("each LoRA may be listed once")
        return self


class CueSettings(_Strict):
    at: float = Field(ge=0, le=MAX_DURATION_S, allow_inf_nan=False)
    asset: str = Field(min_length=1, max_length=1024)
    gain_db: float = Field(default=0.0, ge=-60, le=12, allow_inf_nan=False)

    @field_validator("asset")
    @classmethod
    def _reference(cls, value: str) -> str:
        return asset_reference(value)


class LoudnessSettings(_Strict):
    # a delivery profile's values (LOUDNESS_PROFILES), which `integrated`/`true_peak` override
    profile: Literal[tuple(LOUDNESS_PROFILES)] | None = None  # type: ignore[valid-type]
    integrated: float | None = Field(default=None, ge=-40, le=-5, allow_inf_nan=False)
    true_peak: float | None = Field(default=None, ge=-9, le=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _target(self) -> LoudnessSettings:
        if self.profile is None and self.integrated is None:
            raise ValueError(
                f"give a profile ({', '.join(LOUDNESS_PROFILES)}) or the integrated loudness "
                "in LUFS, e.g. {integrated: -16, true_peak: -1}"
            )
        return self


class AudioSettings(_Strict):
    asset: str | None = Field(default=None, min_length=1, max_length=1024)  # the bed
    gain_db: float = Field(default=0.0, ge=-60, le=12, allow_inf_nan=False)
    loop: StrictBool = True
    cues: list[CueSettings] | None = Field(default=None, min_length=1, max_length=MAX_CUES)
    loudness: LoudnessSettings | None = None

    @field_validator("asset")
    @classmethod
    def _reference(cls, value: str | None) -> str | None:
        return None if value is None else asset_reference(value)

    @field_validator("loudness", mode="before")
    @classmethod
    def _profile(cls, value: Any) -> Any:
        return {"profile": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _sound(self) -> AudioSettings:
        if self.asset is None and not self.cues:
            raise ValueError("give a bed (asset), cues, or both; or say audio: silence")
        return self


class ImageSettings(_Strict):
    asset: str = Field(min_length=1, max_length=1024)
    role: Literal[IMAGE_ROLES] = Field(default="first-frame", alias="as")  # type: ignore[valid-type]

    @field_validator("asset")
    @classmethod
    def _reference(cls, value: str) -> str:
        return asset_reference(value)


class CameraSettings(_Strict):
    asset: str = Field(min_length=1, max_length=1024)
    strength: float = Field(default=1.0, ge=0, le=1, allow_inf_nan=False)
    fit: Literal[CAMERA_FITS] = "stretch"  # type: ignore[valid-type]

    @field_validator("asset")
    @classmethod
    def _reference(cls, value: str) -> str:
        return asset_reference(value)


class SceneSettings(_Strict):
    start: Seconds
    end: Seconds | None = None
    prompt: Prompt
    # continue | cut | {transition: NAME, seconds: S}: read by the manifest's _join, which
    # names the exact field and the valid choices in its messages
    join: Any = "continue"
    image: ImageSettings | None = None  # a first frame or a reference picture
    camera: CameraSettings | None = None  # a camera-move template it follows


class VideoSettings(_Strict):
    """Settings a video may take from `defaults`; all optional here, required after merging."""

    duration: float | None = Field(default=None, gt=0, le=MAX_DURATION_S, allow_inf_nan=False)
    fps: StrictInt | None = Field(default=None, ge=1, le=MAX_FPS)
    resolution: Resolution | None = None
    seed: StrictInt | None = Field(default=None, ge=0, le=MAX_SEED)
    negative_prompt: str | None = Field(default=None, max_length=MAX_PROMPT_CHARS)
    model: ModelSettings | None = None
    segment: SegmentSettings | None = None
    renditions: list[Literal[RENDITIONS]] | None = Field(default=None, min_length=1)  # type: ignore[valid-type]
    audio: AudioSettings | None = None
    keyframes: Literal[KEYFRAME_LAYOUTS] | None = None  # type: ignore[valid-type]
    # seconds a shot runs on past a cut or transition, at least (docs/manifest.md, "Shots")
    run_on: float | None = Field(default=None, ge=0, le=TRANSITION_SECONDS[1], allow_inf_nan=False)
    # how a scene's picture meets the frame size: pad (fit, black bars) or crop (cover)
    image_fit: Literal[IMAGE_FITS] | None = None  # type: ignore[valid-type]

    @field_validator("audio", mode="before")
    @classmethod
    def _silence(cls, value: Any) -> Any:
        return None if value == "silence" else value

    @field_validator("renditions")
    @classmethod
    def _unique_renditions(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError("each rendition may be listed once")
        return value


class VideoEntry(VideoSettings):
    id: SafeId | None = None
    prompt: Prompt | None = None
    scenes: list[SceneSettings] | None = Field(default=None, min_length=1, max_length=MAX_SCENES)


class ManifestDocument(_Strict):
    batch: SafeId
    # `required`: every QC-passed video waits in the review stage until approved (console.md)
    review: Literal["required", "none"] = "none"
    defaults: VideoSettings = VideoSettings()
    videos: list[Any] = Field(min_length=1, max_length=MAX_VIDEOS)  # each one validated alone


BUILTIN_DEFAULTS: dict[str, Any] = {
    "fps": 24,
    "resolution": Resolution(width=1280, height=720),
    "negative_prompt": "",
    "model": ModelSettings(family="procedural"),
    "segment": SegmentSettings(),  # all from the family, or the defaults
    "renditions": list(DEFAULT_RENDITIONS),
    "audio": None,
    "keyframes": DEFAULT_KEYFRAMES,
    "run_on": DEFAULT_RUN_ON,
    "image_fit": DEFAULT_IMAGE_FIT,
}
