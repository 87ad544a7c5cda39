"""Before anything is written or any GPU second is spent: every file a manifest refers to is
checked, and files named beside the manifest are put into the store.

- An asset (audio bed, sound cue, a scene's picture, LoRA) named by a path in the
  manifest's folder (`./beds/calm.ogg`; never outside it, links included) is hashed and
  becomes the store key
  `assets/sha256/<hex>.<ext>`: the job's spec names the content, the file is uploaded once,
  and a changed file is a different job. A bed or a cue must decode as audio, within
  factory/media/sound.py's limits (length, size); a picture as PNG, JPEG or WebP within
  factory/media/images.py's (size, pixels: no decompression bomb).
- A store key, an `s3://` URL or a `file://` URL must exist now; a sound, picture or camera
  template named so is then checked as a file beside the manifest is, by the same function
  and words: one whose size as the store reports it is over the kind's limit is refused
  without a download, else it is fetched once (however many fields name it) to a temporary
  file, a `file://` one read in place. A LoRA is only looked for. A store that cannot be
  reached, to look or to fetch, is an error of its own (exit 1), never a silent pass.
- An asset or model directory outside what the operator allows (FACTORY_ASSET_ROOTS,
  FACTORY_MODEL_ROOTS, FACTORY_ASSET_BUCKETS; factory/infra/confinement.py) is refused before
  anything is looked at.
- A model directory visible from this host must be a diffusers folder with every component
  its family needs. One that is not visible here (the submitting host is not a GPU node) is a
  warning: the GPU worker checks it before the job's first segment.

`check()` reads and hashes but writes nothing; `upload()` then puts the local files into the
store. Problems are named by the manifest field they come from (`videos[3].audio.asset`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from factory.config.s3 import S3Settings
from factory.errors import BadInput, FactoryError, FieldProblem, ManifestError, RetryableError
from factory.generate.families import FAMILIES
from factory.infra.confinement import Confinement
from factory.manifest import Manifest, is_local_path
from factory.media.control import MAX_CONTROL_BYTES
from factory.media.images import MAX_IMAGE_BYTES
from factory.media.sandbox import picture_problem, sound_problem, video_problem
from factory.media.sound import MAX_SOUND_BYTES
from factory.spec import LoraChoice, VideoSpec
from factory.store.base import Store

CONTENT_PREFIX = "assets/sha256"


class StoreUnreachable(FactoryError):
    """The store could not be asked whether the manifest's assets exist (exit 1)."""


@dataclass
class Preflight:
    manifest: Manifest  # local paths replaced by their content keys
    uploads: dict[str, Path] = field(default_factory=dict)  # content key -> local file
    warnings: list[FieldProblem] = field(default_factory=list)


@dataclass(frozen=True)
class _Reference:
    field: str  # manifest path, e.g. videos[3].audio.asset
    value: str
    sound: bool = False  # a bed or a cue: a file beside the manifest must decode as audio
    picture: bool = False  # a scene's image: it must decode as a picture within limits
    control: bool = False  # a camera-move template: it must decode as video within limits


def check(
    manifest: Manifest,
    open_store: Callable[[], Store],
    *,
    confinement: Confinement,
    s3: S3Settings | None = None,
    base_dir: Path | None = None,
    allow_local: bool = True,
) -> Preflight:
    """Check every asset and model directory of the manifest; raise ManifestError (exit 2)
    naming each bad field, or StoreUnreachable (exit 1). Nothing is written."""
    base = base_dir if base_dir is not None else _manifest_dir(manifest.source)
    problems: list[FieldProblem] = []
    warnings: list[FieldProblem] = []
    local_keys, uploads = _checked_assets(_references(manifest), base, open_store,
                                          confinement, s3, allow_local, problems)  # fmt: skip
    _check_model_dirs(manifest, confinement, problems, warnings)
    if problems:
        raise ManifestError(manifest.source, _first_per_field(problems))
    videos = tuple(_with_keys(video, local_keys) for video in manifest.videos)
    return Preflight(replace(manifest, videos=videos), uploads, warnings)


def _checked_assets(
    references: list[_Reference],
    base: Path,
    open_store: Callable[[], Store],
    confinement: Confinement,
    s3: S3Settings | None,
    allow_local: bool,
    problems: list[FieldProblem],
) -> tuple[dict[str, str], dict[str, Path]]:
    """Every reference checked (problems added); the content key of each local file, and
    the files to upload by content key."""
    local_keys: dict[str, str] = {}  # reference -> content key
    uploads: dict[str, Path] = {}
    remote: dict[str, list[_Reference]] = {}  # reference -> the fields naming it
    for reference in references:
        if is_local_path(reference.value) and not allow_local:
            # A manifest sent over the API has no folder: nothing on the server is read.
            problems.append(FieldProblem(reference.field, (
                f"{reference.value} is a file beside the manifest, which a manifest sent over "
                "the API does not have; put it in the store (factory store put FILE KEY) and "
                "name its key")))  # fmt: skip
        elif is_local_path(reference.value):
            if reference.value not in local_keys:
                checked = _local_file(base, reference, problems)
                if checked is not None:
                    key = content_key(checked)
                    local_keys[reference.value] = key
                    uploads[key] = checked
        elif problem := confinement.asset_problem(reference.value):
            problems.append(FieldProblem(reference.field, problem))
        else:
            remote.setdefault(reference.value, []).append(reference)
    if remote:
        _check_remote(remote, open_store, s3, problems)
    return local_keys, uploads


def upload(preflight: Preflight, store: Store) -> int:
    """Put the manifest's local files into the store, once per content; the number put."""
    return upload_files(preflight.uploads, store)


def upload_files(uploads: dict[str, Path], store: Store) -> int:
    """Local files into the store by content key, each once; the number put."""
    put = 0
    for key, path in uploads.items():
        info = store.stat(key)
        if info is not None and info.size == path.stat().st_size:
            continue
        store.put_file(key, path)
        put += 1
    return put


def content_key(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        while chunk := source.read(1 << 20):
            digest.update(chunk)
    suffix = re.sub(r"[^a-z0-9]", "", path.suffix.lower())
    return f"{CONTENT_PREFIX}/{digest.hexdigest()}" + (f".{suffix}" if suffix else "")


# --- what a manifest refers to --------------------------------------------------------------


def _references(manifest: Manifest) -> list[_Reference]:
    found: list[_Reference] = []
    for index, video in enumerate(manifest.videos):
        audio, here = video.audio, manifest.field(index, "audio")
        if audio is not None and audio.asset is not None:
            found.append(_Reference(f"{here}.asset", audio.asset, sound=True))
        for number, cue in enumerate(audio.cues if audio else ()):
            found.append(_Reference(f"{here}.cues[{number}].asset", cue.asset, sound=True))
        for number, scene in enumerate(video.scenes):
            if scene.image is not None:
                where = f"{manifest.field(index, 'scenes')}[{number}].image.asset"
                found.append(_Reference(where, scene.image.asset, picture=True))
            if scene.camera is not None:
                where = f"{manifest.field(index, 'scenes')}[{number}].camera.asset"
                found.append(_Reference(where, scene.camera.asset, control=True))
        for number, lora in enumerate(video.model.loras):
            where = f"{manifest.field(index, 'model')}.lora[{number}].asset"
            found.append(_Reference(where, lora.asset))
    return found


def _manifest_dir(source: str) -> Path:
    path = Path(source)
    return path.parent if path.name and not source.startswith("<") else Path.cwd()


def _local_file(base: Path, reference: _Reference, problems: list[FieldProblem]) -> Path | None:
    path = (base / reference.value).resolve()
    if not path.is_relative_to(base.resolve()):
        problems.append(
            FieldProblem(reference.field, f"{reference.value} leads out of the manifest's folder")
        )
        return None
    if not path.exists():
        problems.append(
            FieldProblem(reference.field, f"{reference.value} does not exist (looked for {path})")
        )
        return None
    if not path.is_file():
        problems.append(FieldProblem(reference.field, f"{reference.value} is not a file ({path})"))
        return None
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        problems.append(FieldProblem(reference.field, f"{path} cannot be read: {exc.strerror}"))
        return None
    problem = (sound_problem(path) if reference.sound else
               picture_problem(path) if reference.picture else
               video_problem(path) if reference.control else None)  # fmt: skip
    if problem:
        problems.append(FieldProblem(reference.field, f"{reference.value} {problem}"))
        return None
    return path


@dataclass
class _Remote:
    """One object in a store, with every field naming it (however each spells it)."""

    store: Store
    key: str
    where_text: str
    named: list[tuple[str, str, Callable[[Path], str | None]]]  # (field, reference, check)


def _check_remote(
    references: dict[str, list[_Reference]],
    open_store: Callable[[], Store],
    s3: S3Settings | None,
    problems: list[FieldProblem],
) -> None:
    """Every remote asset must exist now; a picture, sound or camera template must also be
    within its size (from the store's stat, not downloaded when over) and decode, checked by
    the same function as a file beside the manifest, on one download per object."""
    stores: dict[str, Store] = {}
    to_fetch: dict[str, _Remote] = {}  # the object's URL -> what to check on it
    for reference, naming in references.items():
        fields = [named.field for named in naming]
        if reference.startswith("file://"):
            path = Path(unquote(urlparse(reference).path))
            if not path.is_file():
                message = (
                    f"{reference} is not a file on this host (file:// assets must be readable "
                    "where the batch is submitted and on the workers; or put the file in the "
                    "store)"
                )
                problems += [FieldProblem(where, message) for where in fields]
                continue
            try:
                with open(path, "rb"):
                    pass
            except OSError as exc:
                message = f"{reference} cannot be read: {exc.strerror}"
                problems += [FieldProblem(where, message) for where in fields]
                continue
            asked = [(named.field, reference, check) for named in naming
                     if (check := _content_check(named)[0]) is not None]  # fmt: skip
            _check_content(path, asked, problems)  # in place: nothing to download
            continue
        where_text = reference
        try:
            store, key, where_text = _store_for(reference, open_store, s3, stores)
            info = store.stat(key)
        except (FactoryError, OSError) as exc:
            _unreachable(exc, reference, fields, where_text, problems)
            continue
        if info is None:
            problems += [FieldProblem(where, _absent(reference, where_text)) for where in fields]
            continue
        for named in naming:
            check, limit = _content_check(named)
            if check is None:
                continue
            if info.size > limit:  # the store's word: refused without a download
                message = f"{reference} is {info.size >> 20} MiB; at most {limit >> 20} MiB"
                problems.append(FieldProblem(named.field, message))
                continue
            url = store.url_for(key)
            remote = to_fetch.setdefault(url, _Remote(store, key, where_text, []))
            remote.named.append((named.field, reference, check))
    for remote in to_fetch.values():
        with ExitStack() as fetched:
            try:
                path = fetched.enter_context(remote.store.local_path(remote.key))
            except FileNotFoundError:  # gone since it was looked at
                problems += [FieldProblem(where, _absent(reference, remote.where_text))
                             for where, reference, _ in remote.named]  # fmt: skip
                continue
            except (FactoryError, OSError) as exc:
                fields = [where for where, _, _ in remote.named]
                _unreachable(exc, remote.named[0][1], fields, remote.where_text, problems)
                continue
            _check_content(path, remote.named, problems)


def _content_check(reference: _Reference) -> tuple[Callable[[Path], str | None] | None, int]:
    """The check a file beside the manifest gets and the byte limit over which the store's
    stat alone refuses it; (None, 0) for a LoRA, only looked for (nothing decodes one)."""
    if reference.sound:
        return sound_problem, MAX_SOUND_BYTES
    if reference.picture:
        return picture_problem, MAX_IMAGE_BYTES
    if reference.control:
        return video_problem, MAX_CONTROL_BYTES
    return None, 0


def _check_content(
    path: Path,
    named: list[tuple[str, str, Callable[[Path], str | None]]],
    problems: list[FieldProblem],
) -> None:
    """Each check once on the file; its problem for every field that asked for it, worded
    as for a file beside the manifest (the reference as that field spells it)."""
    found: dict[Callable[[Path], str | None], str | None] = {}
    for where, reference, check in named:
        if check not in found:
            found[check] = check(path)
        if problem := found[check]:
            problems.append(FieldProblem(where, f"{reference} {problem}"))


def _absent(reference: str, where_text: str) -> str:
    return f"{reference} does not exist in {where_text}" + (
        ""
        if reference.startswith("s3://")
        else f"; upload it with `factory store put FILE {reference}`, or name a file "
        "beside the manifest as ./path"
    )


def _unreachable(
    exc: Exception,
    reference: str,
    fields: list[str],
    where_text: str,
    problems: list[FieldProblem],
) -> None:
    """A reference the store refuses (not a valid key) is the fields' problem; anything else
    means the store could not be asked: StoreUnreachable, never a silent pass."""
    if isinstance(exc, BadInput):
        problems += [FieldProblem(where, str(exc)) for where in fields]
        return
    reason = exc.reason if isinstance(exc, RetryableError) else str(exc)
    raise StoreUnreachable(
        f"cannot check {fields[0]} ({reference}): {where_text} cannot be reached: {reason}"
    ) from None


def _store_for(
    reference: str,
    open_store: Callable[[], Store],
    s3: S3Settings | None,
    stores: dict[str, Store],
) -> tuple[Store, str, str]:
    if reference.startswith("s3://"):
        parsed = urlparse(reference)
        base = f"s3://{parsed.netloc}"
        if base not in stores:
            from factory.store.s3 import S3Store  # boto3 only where S3 is used

            stores[base] = S3Store(base, s3 or S3Settings())
        return stores[base], parsed.path.lstrip("/"), f"bucket {parsed.netloc}"
    if "" not in stores:
        stores[""] = open_store()
    store = stores[""]
    return store, reference, f"the store ({store.url})"


def _check_model_dirs(
    manifest: Manifest,
    confinement: Confinement,
    problems: list[FieldProblem],
    warnings: list[FieldProblem],
) -> None:
    seen: set[tuple[str, str]] = set()
    for index, video in enumerate(manifest.videos):
        family, path = video.model.family, video.model.path
        if family not in FAMILIES or not path or (family, path) in seen:
            continue
        seen.add((family, path))
        where = f"{manifest.field(index, 'model')}.path"
        if outside := confinement.model_problem(path):
            problems.append(FieldProblem(where, outside))
            continue
        verdict = model_dir_verdict(family, path)
        if verdict.problem:
            problems.append(FieldProblem(where, verdict.problem))
        elif verdict.warning:
            warnings.append(FieldProblem(where, verdict.warning))
        elif family == "helios":
            problems.extend(_helios_sizes(manifest, path, where))


def _helios_sizes(manifest: Manifest, path: str, where: str) -> list[FieldProblem]:
    """Helios mid and distilled (pyramid) need sides in multiples of 64: every video of the
    manifest on this directory is checked, naming its resolution."""
    from factory.generate.model_dir import PYRAMID_SIZE_MULTIPLE, ModelDirProblem, helios_variant

    try:
        variant = helios_variant(path)
    except ModelDirProblem as exc:
        return [FieldProblem(where, exc.reason)]
    multiple = PYRAMID_SIZE_MULTIPLE
    found = []
    for index, video in enumerate(manifest.videos):
        if (video.model.family, video.model.path) != ("helios", path) or variant == "base":
            continue
        if video.width % multiple or video.height % multiple:
            message = (
                f"{video.width}x{video.height} does not suit Helios {variant} (pyramid): "
                f"width and height must be multiples of {multiple}, e.g. 640x384"
            )
            found.append(FieldProblem(manifest.field(index, "resolution"), message))
    return found


@dataclass(frozen=True)
class ModelDirVerdict:
    problem: str | None = None  # refuse the manifest
    warning: str | None = None  # accept; the GPU worker checks before the first segment


def model_dir_verdict(family: str, path: str) -> ModelDirVerdict:
    """A model directory seen from this host. One whose folder is here but not the directory
    itself does not exist; one whose folder is not here either is on GPU nodes only."""
    from factory.generate.model_dir import ModelDirProblem, check_model_dir

    root = Path(path)
    if not root.exists() and not root.parent.is_dir():
        return ModelDirVerdict(
            warning=f"{path} is not visible from this host; each GPU worker checks it "
            "before the job's first segment"
        )
    try:
        check_model_dir(path, FAMILIES[family].needed_components)
    except ModelDirProblem as exc:
        return ModelDirVerdict(problem=exc.reason)
    return ModelDirVerdict()


def _with_keys(video: VideoSpec, keys: dict[str, str]) -> VideoSpec:
    if not keys:
        return video
    audio = video.audio
    if audio is not None:
        cues = tuple(replace(cue, asset=keys.get(cue.asset, cue.asset)) for cue in audio.cues)
        bed = keys.get(audio.asset, audio.asset) if audio.asset is not None else None
        audio = replace(audio, asset=bed, cues=cues)
    loras = tuple(
        LoraChoice(keys.get(lora.asset, lora.asset), lora.scale) for lora in video.model.loras
    )
    model = replace(video.model, loras=loras)

    def keyed(found: Any) -> Any:
        return None if found is None else replace(found, asset=keys.get(found.asset, found.asset))

    scenes = tuple(replace(scene, image=keyed(scene.image), camera=keyed(scene.camera))
                   for scene in video.scenes)  # fmt: skip
    return replace(video, audio=audio, model=model, scenes=scenes)


def _first_per_field(problems: list[FieldProblem]) -> list[FieldProblem]:
    return list(dict.fromkeys(problems))


def check_material(
    named: list[tuple[str, str, str]],
    open_store: Callable[[], Store],
    *,
    confinement: Confinement,
    s3: S3Settings | None = None,
    base_dir: Path | None = None,
    allow_local: bool = True,
) -> tuple[dict[str, str], dict[str, Path]]:
    """Pictures and camera moves a redo swaps in (factory/plan/material.py), checked as a
    manifest's are: ``named`` is (field, asset, kind: image | camera). The store name of
    each asset (a local file's content key) and the files to upload; BadInput naming the
    field of the first problem, or StoreUnreachable."""
    references = [_Reference(where, value, picture=kind == "image", control=kind == "camera")
                  for where, value, kind in named]  # fmt: skip
    problems: list[FieldProblem] = []
    keys, uploads = _checked_assets(references, base_dir or Path.cwd(), open_store,
                                    confinement, s3, allow_local, problems)  # fmt: skip
    if problems:
        raise BadInput(problems[0].message, field=problems[0].path)
    return {value: keys.get(value, value) for _, value, _ in named}, uploads
