"""Manifest schema and validation: a batch of videos in, one resolved ``VideoSpec`` per video out.

Validation is all-or-nothing: every problem in the file is collected, each named by its
field path (``videos[3].duration``) and the rule it breaks, and a manifest with any
problem yields no job at all. Limits (documented in docs/manifest.md):
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from factory.errors import FieldProblem, ManifestError, PermanentError
from factory.generate.families import FAMILIES
from factory.manifest.safeyaml import DocumentError, load_json, load_yaml
from factory.spec import (
    DEFAULT_KEYFRAMES,
    DIFFUSERS_FAMILIES,
    KEYFRAME_LAYOUTS,
    MODEL_FAMILIES,
    AudioChoice,
    LoraChoice,
    ModelChoice,
    Scene,
    VideoSpec,
    derived_seed,
    derived_video_id,
    frames_for,
    job_id_for,
)

MAX_MANIFEST_BYTES = 1024 * 1024
MAX_VIDEOS = 100
MAX_DURATION_S = 600.0
MAX_FPS = 60
MIN_SIDE, MAX_SIDE = 64, 3840
MAX_PIXELS = 3840 * 2160
SIDE_MULTIPLE = 8
MAX_PROMPT_CHARS = 2000
MAX_SCENES = 200
MAX_SEGMENT_FRAMES = 1024
MAX_SEED = 2**32 - 1
MAX_SECONDS_PER_SEGMENT = 3600.0
MAX_LORAS = 4
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


def is_local_path(reference: str) -> bool:
    """`./beds/calm.ogg`: a file in the manifest's folder (or below it), put into the store
    (content-addressed) when the manifest is submitted."""
    return reference.startswith("./")


def _asset_reference(value: str) -> str:
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


class LoraSettings(_Strict):
    asset: str = Field(min_length=1, max_length=1024)
    scale: float = Field(default=1.0, ge=-4, le=4, allow_inf_nan=False)

    @field_validator("asset")
    @classmethod
    def _reference(cls, value: str) -> str:
        if not value.endswith(".safetensors"):
            raise ValueError(f"{value!r} must be a .safetensors file (a LoRA as trainers save it)")
        return _asset_reference(value)


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


class AudioSettings(_Strict):
    asset: str = Field(min_length=1, max_length=1024)
    gain_db: float = Field(default=0.0, ge=-60, le=12, allow_inf_nan=False)
    loop: StrictBool = True

    @field_validator("asset")
    @classmethod
    def _reference(cls, value: str) -> str:
        return _asset_reference(value)


class SceneSettings(_Strict):
    start: Seconds
    end: Seconds | None = None
    prompt: Prompt


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


_BUILTIN_DEFAULTS: dict[str, Any] = {
    "fps": 24,
    "resolution": Resolution(width=1280, height=720),
    "negative_prompt": "",
    "model": ModelSettings(family="procedural"),
    "segment": SegmentSettings(),  # all from the family, or the defaults
    "renditions": list(DEFAULT_RENDITIONS),
    "audio": None,
    "keyframes": DEFAULT_KEYFRAMES,
}
_MERGED_FIELDS = tuple(VideoSettings.model_fields)


@dataclass(frozen=True)
class Manifest:
    source: str
    batch: str
    videos: tuple[VideoSpec, ...]
    # per video, where each merged setting came from: {"audio": "defaults.audio", ...}
    origins: tuple[dict[str, str], ...] = ()
    review: bool = False  # `review: required`

    def field(self, index: int, name: str) -> str:
        """The manifest path of a video's setting, e.g. `videos[3].audio` or `defaults.audio`."""
        origins = self.origins[index] if index < len(self.origins) else {}
        return origins.get(name, f"videos[{index}].{name}")


def load_manifest(path: str | Path, *, batch: str | None = None) -> Manifest:
    """Read, parse and validate a manifest file (YAML, or JSON by its .json extension)."""
    path = Path(path)
    source = str(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ManifestError(source, [FieldProblem("", f"cannot read: {exc.strerror}")]) from None
    if not path.is_file():
        raise ManifestError(source, [FieldProblem("", "is not a file")])
    if size > MAX_MANIFEST_BYTES:
        limit = MAX_MANIFEST_BYTES // 1024
        message = f"is {size} bytes; the limit is {limit} KiB"
        raise ManifestError(source, [FieldProblem("", message)])
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        problem = FieldProblem("", f"is not UTF-8 text (byte {exc.start})")
        raise ManifestError(source, [problem]) from None
    fmt = "json" if path.suffix.lower() == ".json" else "yaml"
    return parse_manifest(text, source=source, fmt=fmt, batch=batch)


def parse_manifest(
    text: str, *, source: str = "<manifest>", fmt: str = "yaml", batch: str | None = None
) -> Manifest:
    if len(text.encode()) > MAX_MANIFEST_BYTES:
        raise ManifestError(source, [FieldProblem("", "is larger than 1024 KiB")])
    try:
        raw = load_json(text) if fmt == "json" else load_yaml(text)
    except DocumentError as exc:
        raise ManifestError(source, [FieldProblem("", str(exc))]) from None
    if not isinstance(raw, dict):
        kind = "empty" if raw is None else f"a {type(raw).__name__}"
        message = f"must be a mapping with `batch` and `videos`, got {kind}"
        raise ManifestError(source, [FieldProblem("", message)])
    if batch is not None:
        raw = {**raw, "batch": batch}
    return parse_manifest_data(raw, source=source, batch_overridden=batch is not None)


def parse_manifest_data(
    raw: dict[str, Any], *, source: str = "<manifest>", batch_overridden: bool = False
) -> Manifest:
    """Validate a manifest already parsed into Python values."""
    problems: list[FieldProblem] = []
    document: ManifestDocument | None = None
    try:
        document = ManifestDocument.model_validate(raw)
    except ValidationError as exc:
        problems += _problems_from(exc, batch_overridden=batch_overridden)
    entries = _entries(raw.get("videos"), problems)
    origins: list[dict[str, str]] = []
    if document is not None:
        videos = []
        for index, entry in enumerate(entries):
            origin: dict[str, str] = {}
            videos.append(_resolve(document, entry, index, problems, origin) if entry else None)
            origins.append(origin)
        _check_unique_ids(videos, problems)
    if problems or document is None:
        raise ManifestError(source, problems)
    return Manifest(
        source=source,
        batch=document.batch,
        videos=tuple(v for v in videos if v),
        origins=tuple(origins),
        review=document.review == "required",
    )


def _entries(raw_videos: Any, problems: list[FieldProblem]) -> list[VideoEntry | None]:
    """Each video validated on its own, so that one bad video does not hide another's problems."""
    if not isinstance(raw_videos, list) or len(raw_videos) > MAX_VIDEOS:
        return []
    entries: list[VideoEntry | None] = []
    for index, item in enumerate(raw_videos):
        try:
            entries.append(VideoEntry.model_validate(item))
        except ValidationError as exc:
            problems += _problems_from(exc, prefix=("videos", index))
            entries.append(None)
    return entries


def _resolve(
    document: ManifestDocument,
    entry: VideoEntry,
    index: int,
    problems: list[FieldProblem],
    origin: dict[str, str],
) -> VideoSpec | None:
    here = f"videos[{index}]"
    values: dict[str, Any] = dict(_BUILTIN_DEFAULTS)
    for scope, path in ((document.defaults, "defaults"), (entry, here)):
        for name in scope.model_fields_set & set(_MERGED_FIELDS):
            values[name] = getattr(scope, name)
            origin[name] = f"{path}.{name}"
    start = len(problems)
    for name in ("duration", "fps", "resolution", "model", "segment", "renditions"):
        if values.get(name) is None:
            problems.append(
                FieldProblem(
                    origin.get(name, f"{here}.{name}"),
                    "required: set it on the video or in `defaults`",
                )
            )
    if (entry.prompt is None) == (entry.scenes is None):
        problems.append(FieldProblem(f"{here}.prompt", "give exactly one of `prompt` or `scenes`"))
    if len(problems) > start:
        return None
    duration, fps = values["duration"], values["fps"]
    if frames_for(duration, fps) < 1:
        message = f"{duration} s at {fps} fps is less than one frame"
        problems.append(FieldProblem(origin["duration"], message))
        return None
    scenes = _scenes(entry, duration, here, problems)
    if scenes is None:
        return None
    negative_prompt = values["negative_prompt"] or ""
    seed = values.get("seed")
    model: ModelSettings = values["model"]
    segment = _effective_segment(model, values["segment"], origin, here, problems)
    if segment is None:
        return None
    audio: AudioSettings | None = values["audio"]
    resolution: Resolution = values["resolution"]
    if not _fits_family(model, segment, resolution, origin, here, problems):
        return None
    spec = VideoSpec(
        batch=document.batch,
        video_id=entry.id or "",
        duration=float(duration),
        fps=fps,
        width=resolution.width,
        height=resolution.height,
        seed=derived_seed(scenes, negative_prompt) if seed is None else seed,
        scenes=scenes,
        negative_prompt=negative_prompt,
        model=ModelChoice(
            model.family,
            model.path,
            model.seconds_per_segment,
            model.steps,
            model.guidance,
            tuple(LoraChoice(lora.asset, lora.scale) for lora in model.lora or ()),
        ),
        segment_frames=segment.frames,
        segment_overlap=segment.overlap,
        renditions=tuple(values["renditions"]),
        audio=AudioChoice(audio.asset, audio.gain_db, audio.loop) if audio else None,
        keyframes=values["keyframes"] or DEFAULT_KEYFRAMES,
    )
    if not entry.id:
        content = {k: v for k, v in spec.to_dict().items() if k not in ("batch", "video_id")}
        spec = VideoSpec(**{**spec.__dict__, "video_id": derived_video_id(content)})
    return spec


def _effective_segment(
    model: ModelSettings,
    given: SegmentSettings,
    origin: dict[str, str],
    here: str,
    problems: list[FieldProblem],
) -> SegmentSettings | None:
    """The segment settings the manifest gave, completed by the model family's own where it
    left them out (docs/models.md lists each family's native segment and overlap)."""
    family = FAMILIES.get(model.family)
    frames = given.frames
    if frames is None:
        frames = family.segment_frames if family else DEFAULT_SEGMENT_FRAMES
    overlap = given.overlap
    if overlap is None:
        overlap = family.fitting_overlap(frames) if family else DEFAULT_SEGMENT_OVERLAP
        overlap = min(overlap, frames // 2)
    if 2 * overlap > frames:
        where = origin.get("segment", f"{here}.segment")
        message = f"{overlap} must be at most half of segment.frames ({frames})"
        problems.append(FieldProblem(f"{where}.overlap", message))
        return None
    return SegmentSettings(frames=frames, overlap=overlap)


def _fits_family(
    model: ModelSettings,
    segment: SegmentSettings,
    resolution: Resolution,
    origin: dict[str, str],
    here: str,
    problems: list[FieldProblem],
) -> bool:
    """The frame and size rules of a diffusers family's VAE (the released models' values)."""
    if model.family not in FAMILIES:
        return True
    family = FAMILIES[model.family]
    found = len(problems)
    overlap_problem = family.overlap_problem(segment.overlap)
    if overlap_problem:
        where = origin.get("segment", f"{here}.segment")
        problems.append(FieldProblem(f"{where}.overlap", overlap_problem))
    length_problem = family.segment_problem(segment.frames, segment.overlap)
    if length_problem and not overlap_problem:
        where = origin.get("segment", f"{here}.segment")
        problems.append(FieldProblem(f"{where}.frames", length_problem))
    multiple = family.size_multiple
    if resolution.width % multiple or resolution.height % multiple:
        problems.append(
            FieldProblem(
                origin.get("resolution", f"{here}.resolution"),
                f"{resolution.width}x{resolution.height} does not suit {model.family}: width "
                f"and height must be multiples of {multiple}",
            )
        )
    return len(problems) == found


def _scenes(
    entry: VideoEntry, duration: float, here: str, problems: list[FieldProblem]
) -> tuple[Scene, ...] | None:
    if entry.prompt is not None:
        return (Scene(start=0.0, end=float(duration), prompt=entry.prompt),)
    assert entry.scenes is not None
    scenes = entry.scenes
    ends = [s.start for s in scenes[1:]] + [float(duration)]
    found = len(problems)

    def problem(path: str, message: str) -> None:
        problems.append(FieldProblem(f"{here}.scenes{path}", message))

    if scenes[0].start != 0:
        problem("[0].start", f"the first scene must start at 0, not {scenes[0].start}")
    for i, (scene, following) in enumerate(zip(scenes, ends, strict=True)):
        last = i + 1 == len(scenes)
        if scene.start >= duration:
            problem(f"[{i}].start", f"{scene.start} is not before the video's end ({duration} s)")
        elif not last and following <= scene.start:
            problem(
                f"[{i + 1}].start", f"{following} must be after the scene before ({scene.start})"
            )
        elif scene.end is not None and scene.end != following:
            what = "the video's duration" if last else "the next scene's start"
            problem(
                f"[{i}].end",
                f"{scene.end} leaves a gap or overlap: it must be {what} ({following})",
            )
    if len(problems) > found:
        return None
    return tuple(
        Scene(start=float(s.start), end=float(end), prompt=s.prompt)
        for s, end in zip(scenes, ends, strict=True)
    )


def _check_unique_ids(videos: list[VideoSpec | None], problems: list[FieldProblem]) -> None:
    first_index: dict[str, int] = {}
    for index, video in enumerate(videos):
        if video is None:
            continue
        seen = first_index.setdefault(video.video_id, index)
        if seen != index:
            job_id = job_id_for(video.batch, video.video_id)
            message = f"{job_id!r} is a duplicate of videos[{seen}]"
            problems.append(FieldProblem(f"videos[{index}].id", message))


def _problems_from(
    exc: ValidationError, *, batch_overridden: bool = False, prefix: tuple[Any, ...] = ()
) -> list[FieldProblem]:
    problems = []
    for error in exc.errors(include_url=False):
        path = _format_loc(prefix + tuple(error["loc"]))
        if path == "batch" and batch_overridden:
            path = "batch (--batch)"
        problems.append(FieldProblem(path, _describe(error)))
    return problems


def _format_loc(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def _describe(error: dict[str, Any]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "required"
    message = str(error["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    value = error.get("input")
    plain = isinstance(value, (int, float, str, bool)) and len(repr(value)) < 60
    if kind != "value_error" and plain:
        message += f" (got {value!r})"
    return message


class StoredSpecError(PermanentError):
    """A job's spec read back from the database breaks the manifest rules (it was changed
    after submission, or written by something other than `factory submit`)."""


def revalidated_spec(data: Any, job_id: str | None = None) -> VideoSpec:
    """A spec read back from the database, put through the manifest rules again: every
    value that reaches work paths, store keys, ffmpeg arguments and model loading is checked
    as if the video had been submitted now, and the result must be the very spec stored."""
    where = f"job {job_id}" if job_id else "stored spec"
    try:
        spec = VideoSpec.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise StoredSpecError(f"{where}: the stored spec is malformed ({exc!r:.200})") from None
    problems: list[FieldProblem] = []
    for name, asset in (("audio.asset", spec.audio.asset if spec.audio else None),
                        *(("lora.asset", lora.asset) for lora in spec.model.loras)):  # fmt: skip
        if asset is not None and is_local_path(asset):
            problems.append(FieldProblem(name, f"{asset!r}: a stored spec names store content"))
    raw = {"batch": spec.batch, "videos": [_entry_of(spec)]}
    resolved: Manifest | None = None
    try:
        resolved = parse_manifest_data(raw, source=where)
    except ManifestError as exc:
        problems += exc.problems
    if not problems and resolved is not None and resolved.videos != (spec,):
        problems.append(FieldProblem("", "does not resolve to itself under the manifest rules"))
    if job_id is not None and not problems and spec.job_id != job_id:
        problems.append(FieldProblem("job_id", f"{job_id!r} is not the spec's {spec.job_id!r}"))
    if problems:
        detail = "; ".join(str(p) for p in problems[:5])
        raise StoredSpecError(f"{where}: the stored spec breaks the manifest rules: {detail}")
    return spec


def _entry_of(spec: VideoSpec) -> dict[str, Any]:
    model: dict[str, Any] = {"family": spec.model.family}
    for name in ("path", "seconds_per_segment", "steps", "guidance"):
        if getattr(spec.model, name) is not None:
            model[name] = getattr(spec.model, name)
    if spec.model.loras:
        model["lora"] = [{"asset": lora.asset, "scale": lora.scale} for lora in spec.model.loras]
    audio = spec.audio
    return {
        "id": spec.video_id,
        "duration": spec.duration,
        "fps": spec.fps,
        "resolution": [spec.width, spec.height],
        "seed": spec.seed,
        "negative_prompt": spec.negative_prompt,
        "model": model,
        "segment": {"frames": spec.segment_frames, "overlap": spec.segment_overlap},
        "renditions": list(spec.renditions),
        "audio": {"asset": audio.asset, "gain_db": audio.gain_db, "loop": audio.loop}
        if audio
        else "silence",
        "scenes": [{"start": s.start, "end": s.end, "prompt": s.prompt} for s in spec.scenes],
        **({"keyframes": spec.keyframes} if spec.keyframes != DEFAULT_KEYFRAMES else {}),
    }
