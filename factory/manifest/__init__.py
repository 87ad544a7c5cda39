"""Manifest schema and validation: a batch of videos in, one resolved ``VideoSpec`` per video out.

Validation is all-or-nothing: every problem in the file is collected, each named by its
field path (``videos[3].duration``) and the rule it breaks, and a manifest with any
problem yields no job at all. Limits (documented in docs/manifest.md):
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from factory.errors import FieldProblem, ManifestError, PermanentError
from factory.generate.families import FAMILIES
from factory.manifest.safeyaml import DocumentError, load_json, load_yaml
from factory.manifest.schema import (
    BUILTIN_DEFAULTS,
    DEFAULT_SEGMENT_FRAMES,
    DEFAULT_SEGMENT_OVERLAP,
    MAX_MANIFEST_BYTES,
    MAX_VIDEOS,
    AudioSettings,
    ManifestDocument,
    ModelSettings,
    Resolution,
    SegmentSettings,
    VideoEntry,
    VideoSettings,
)
from factory.plan.segments import scene_start_frames
from factory.spec import (
    CAMERA_FAMILIES,
    CONTINUE,
    CUT,
    DEFAULT_IMAGE_FIT,
    DEFAULT_KEYFRAMES,
    DEFAULT_RUN_ON,
    IMAGE_FAMILIES,
    LOUDNESS_PROFILES,
    TRANSITION_SECONDS,
    TRANSITIONS,
    AudioChoice,
    CameraMove,
    LoraChoice,
    Loudness,
    ModelChoice,
    Scene,
    SceneImage,
    SoundCue,
    VideoSpec,
    derived_seed,
    derived_video_id,
    frames_for,
    is_local_path,
    job_id_for,
    transition_frames,
)

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
    values = _merged(document, entry, here, problems, origin)
    if values is None:
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
    audio = _audio(values["audio"], duration, origin.get("audio", f"{here}.audio"), problems)
    if audio is False:
        return None
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
        audio=audio,
        keyframes=values["keyframes"] or DEFAULT_KEYFRAMES,
        run_on=float(values["run_on"]),
        image_fit=values["image_fit"],
    )
    if not _check_shots(spec, here, problems) or not _check_images(spec, here, problems):
        return None
    if not entry.id:
        content = {k: v for k, v in spec.to_dict().items() if k not in ("batch", "video_id")}
        spec = VideoSpec(**{**spec.__dict__, "video_id": derived_video_id(content)})
    return spec


def _merged(
    document: ManifestDocument,
    entry: VideoEntry,
    here: str,
    problems: list[FieldProblem],
    origin: dict[str, str],
) -> dict[str, Any] | None:
    """The video's settings: the built-in defaults, then `defaults`, then the video's own
    (`origin` says where each came from); None, with the problems, if one is missing."""
    values: dict[str, Any] = dict(BUILTIN_DEFAULTS)
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
    return None if len(problems) > start else values


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
    joins = [_join(scene.join, i, problem) for i, scene in enumerate(scenes)]
    if len(problems) > found:
        return None
    return tuple(
        Scene(
            float(s.start),
            float(end),
            s.prompt,
            *join,
            image=SceneImage(s.image.asset, s.image.role) if s.image else None,
            camera=CameraMove(s.camera.asset, float(s.camera.strength), s.camera.fit)
            if s.camera
            else None,
        )
        for s, end, join in zip(scenes, ends, joins, strict=True)
    )


def _audio(
    settings: AudioSettings | None, duration: float, here: str, problems: list[FieldProblem]
) -> AudioChoice | Literal[False] | None:
    """The video's sound: its bed, its cues (each starting inside the video) and the loudness
    it is normalised to (a delivery profile's, or its own); False after a problem."""
    if settings is None:
        return None
    found = len(problems)
    cues = []
    for k, cue in enumerate(settings.cues or ()):
        if cue.at >= duration:
            problems.append(FieldProblem(
                f"{here}.cues[{k}].at",
                f"{cue.at:g} s is not inside the video ({duration:g} s long)",
            ))  # fmt: skip
        cues.append(SoundCue(float(cue.at), cue.asset, float(cue.gain_db)))
    loudness = None
    if (wanted := settings.loudness) is not None:
        integrated, true_peak = LOUDNESS_PROFILES.get(wanted.profile or "", (None, -1.0))
        integrated = wanted.integrated if wanted.integrated is not None else integrated
        true_peak = wanted.true_peak if wanted.true_peak is not None else true_peak
        assert integrated is not None  # (LoudnessSettings wants a profile or integrated)
        if true_peak <= integrated:
            problems.append(FieldProblem(
                f"{here}.loudness.true_peak",
                f"{true_peak:g} dBTP is not above the integrated loudness ({integrated:g} LUFS)",
            ))  # fmt: skip
        loudness = Loudness(float(integrated), float(true_peak), wanted.profile)
    if len(problems) > found:
        return False
    cues.sort(key=lambda cue: cue.at)  # (stored in time order: the same sound, one spec)
    return AudioChoice(settings.asset, float(settings.gain_db), settings.loop, tuple(cues),
                       loudness)  # fmt: skip


_JOIN_FORMS = "continue, cut, or {transition: NAME, seconds: S}"


def _join(value: Any, i: int, problem: Callable[[str, str], None]) -> tuple[str, float]:
    """A scene's `join`: continue, cut or a transition with its length; a problem named at
    the exact field otherwise (the first scene has nothing to cut or blend from)."""
    here = f"[{i}].join"
    if value in (CONTINUE, CUT):
        if i == 0 and value == CUT:
            problem(here, "the first scene has nothing to cut from: leave join out")
        return value, 0.0
    if isinstance(value, str):
        hint = (f"; a transition needs its length: {{transition: {value}, seconds: 1}}"
                if value in TRANSITIONS else "")  # fmt: skip
        problem(here, f"{value!r} is not a join: use {_JOIN_FORMS}{hint}")
        return CONTINUE, 0.0
    if not isinstance(value, dict):
        problem(here, f"must be {_JOIN_FORMS}, not {type(value).__name__}")
        return CONTINUE, 0.0
    unknown = sorted(set(value) - {"transition", "seconds"})
    if unknown:
        problem(f"{here}.{unknown[0]}", "not a field of a transition (transition, seconds)")
    name, seconds = value.get("transition"), value.get("seconds")
    low, high = TRANSITION_SECONDS
    if name not in TRANSITIONS:
        problem(f"{here}.transition",
                f"{name!r} is not a transition: use one of {', '.join(TRANSITIONS)}")  # fmt: skip
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        problem(f"{here}.seconds", f"required: the transition's length, {low:g} to {high:g} s")
    elif not low <= seconds <= high:
        problem(f"{here}.seconds", f"{seconds} is outside {low:g} to {high:g} s")
    if i == 0:
        problem(here, "the first scene has nothing to blend from: leave join out")
    ok = name in TRANSITIONS and isinstance(seconds, int | float) and not isinstance(seconds, bool)
    return (str(name), float(seconds)) if ok else (CONTINUE, 0.0)


def _check_shots(spec: VideoSpec, here: str, problems: list[FieldProblem]) -> bool:
    """Every shot at least as long as the transition into it (two transitions never meet)."""
    starts = scene_start_frames([s.start for s in spec.scenes], spec.fps)
    shot_starts = [i for i, scene in enumerate(spec.scenes) if scene.join != CONTINUE]
    ends = [starts[i] for i in shot_starts[1:]] + [spec.frames_total]
    found = len(problems)
    for scene, end in zip(shot_starts, ends[: len(shot_starts)], strict=True):
        length = end - starts[scene]
        frames = transition_frames(spec.scenes[scene], spec.fps)
        if length < max(1, frames):
            problems.append(FieldProblem(
                f"{here}.scenes[{scene}].join",
                f"its shot is {length / spec.fps:.3g} s ({length} frames), shorter than the "
                f"{spec.scenes[scene].transition_seconds:g} s transition into it",
            ))  # fmt: skip
    return len(problems) == found


def _check_images(spec: VideoSpec, here: str, problems: list[FieldProblem]) -> bool:
    """A scene's picture suits its place and the video's family: a first frame starts a shot
    (the first scene, or one that cuts or blends in), and the family can use the kind."""
    found = len(problems)
    for k, scene in enumerate(spec.scenes):
        if scene.camera is not None and spec.model.family not in CAMERA_FAMILIES:
            problems.append(FieldProblem(f"{here}.scenes[{k}].camera", (
                f"{spec.model.family} cannot follow a camera move; families that can: "
                f"{', '.join(CAMERA_FAMILIES)}")))  # fmt: skip
        if scene.image is None:
            continue
        where = f"{here}.scenes[{k}].image.as"
        able = IMAGE_FAMILIES[scene.image.role]
        if spec.model.family not in able:
            problems.append(FieldProblem(where, (
                f"{spec.model.family} cannot use a {scene.image.role} picture; families "
                f"that can: {', '.join(able)}")))  # fmt: skip
        elif scene.image.role == "first-frame" and k and scene.join == CONTINUE:
            problems.append(FieldProblem(where, (
                "a first frame starts a shot, and this scene continues the one before: give "
                "it join: cut (or a transition), or use the picture as: reference")))  # fmt: skip
    return len(problems) == found


def material_problems(spec: VideoSpec) -> list[FieldProblem]:
    """What breaks the rules for pictures and camera moves in a spec (`_check_images`): a redo
    that swaps them (factory/plan/material.py) is held to the manifest's rules."""
    problems: list[FieldProblem] = []
    _check_images(spec, "video", problems)
    return problems


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
    cues = spec.audio.cues if spec.audio else ()
    pictures = [(k, s.image.asset) for k, s in enumerate(spec.scenes) if s.image is not None]
    moves = [(k, s.camera.asset) for k, s in enumerate(spec.scenes) if s.camera is not None]
    for name, asset in (("audio.asset", spec.audio.asset if spec.audio else None),
                        *((f"scenes[{k}].image.asset", a) for k, a in pictures),
                        *((f"scenes[{k}].camera.asset", a) for k, a in moves),
                        *((f"audio.cues[{k}].asset", c.asset) for k, c in enumerate(cues)),
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
        "audio": _audio_entry(audio) if audio else "silence",
        "scenes": [s.to_dict() for s in spec.scenes],
        **({"keyframes": spec.keyframes} if spec.keyframes != DEFAULT_KEYFRAMES else {}),
        **({"run_on": spec.run_on} if spec.run_on != DEFAULT_RUN_ON else {}),
        **({"image_fit": spec.image_fit} if spec.image_fit != DEFAULT_IMAGE_FIT else {}),
    }


def _audio_entry(audio: AudioChoice) -> dict[str, Any]:
    """The manifest's form of a stored sound (what resolves to it again)."""
    entry: dict[str, Any] = {"gain_db": audio.gain_db, "loop": audio.loop}
    if audio.asset is not None:
        entry["asset"] = audio.asset
    if audio.cues:
        entry["cues"] = [{"at": c.at, "asset": c.asset, "gain_db": c.gain_db} for c in audio.cues]
    if audio.loudness is not None:
        loudness = audio.loudness
        entry["loudness"] = {"integrated": loudness.integrated, "true_peak": loudness.true_peak}
        if loudness.profile:
            entry["loudness"]["profile"] = loudness.profile
    return entry
