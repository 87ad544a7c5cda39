"""Everything a manifest refers to is checked at validate/submit, before any job or GPU second:
assets beside the manifest go into the store by content, a missing asset or model directory
is refused naming its field with nothing written, an unreachable store is its own error. A
picture, sound or camera template named remotely (store key, s3://, file://) must decode
within its limits like a file beside the manifest, downloaded at most once, and not at all
when the size the store reports is already over the limit.
Real PostgreSQL, the S3 stand (moto behind nginx with client certificates), real CLI."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import struct
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from PIL import Image
from sqlalchemy import create_engine, text

from factory.errors import ManifestError, RetryableError
from factory.infra.confinement import Confinement
from factory.manifest import load_manifest
from factory.media.control import MAX_CONTROL_BYTES
from factory.media.images import MAX_IMAGE_BYTES
from factory.media.sound import MAX_SOUND_BYTES
from factory.ops import preflight
from factory.store.file import FileStore
from factory.store.s3 import S3Store
from tests.conftest import REPO, run_cli_here
from tests.integration.test_camera import pan_template
from tests.s3stand import free_port

BED = REPO / "examples" / "assets" / "calm-bed.ogg"
PULSE = REPO / "examples" / "assets" / "pulse-bed.ogg"


def postgres_env(tmp_path: Path, pg_url: str, store: str | None = None) -> dict[str, str]:
    env = {
        "FACTORY_HOME": str(tmp_path / "home"),
        "FACTORY_DATABASE_URL": pg_url,
        "FACTORY_REDIS_URL": "",
        "FACTORY_BROKER_URL": "",
        "FACTORY_STORE_URL": store or f"file://{tmp_path / 'store'}",
    }
    assert run_cli_here("db", "upgrade", env=env).returncode == 0
    return env


def four_videos(batch: str, audio: list[str]) -> str:
    lines = [
        f"batch: {batch}",
        "defaults: {duration: 4, fps: 8, resolution: 160x96, segment: {frames: 16, overlap: 4}}",
        "videos:",
    ]
    for index, asset in enumerate(audio):
        lines += [f"  - id: v{index}", f"    prompt: 'scene {index}'"]
        lines += [f"    audio: {{asset: '{asset}'}}"] if asset else []
    return "\n".join(lines) + "\n"


def job_rows(pg_url: str, batch: str) -> int:
    engine = create_engine(pg_url)
    try:
        with engine.connect() as conn:
            return conn.execute(
                text("SELECT count(*) FROM jobs WHERE batch = :b"), {"b": batch}
            ).scalar_one()
    finally:
        engine.dispose()


def stored_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_assets_beside_the_manifest_go_into_the_store_once_by_content(tmp_path: Path, pg_url):
    env = postgres_env(tmp_path, pg_url)
    (tmp_path / "beds").mkdir()
    shutil.copy(BED, tmp_path / "beds" / "calm.ogg")
    shutil.copy(BED, tmp_path / "same-bytes-other-name.ogg")
    manifest = tmp_path / "m.yaml"
    manifest.write_text(four_videos("local", ["./beds/calm.ogg", "./same-bytes-other-name.ogg"]))
    done = run_cli_here("submit", str(manifest), env=env)
    assert done.returncode == 0, done.stderr
    digest = hashlib.sha256(BED.read_bytes()).hexdigest()
    key = f"assets/sha256/{digest}.ogg"
    assert stored_files(tmp_path / "store") == [key]
    status = json.loads(run_cli_here("status", "local.v0", "--json", env=env).stdout)
    assert status["spec"]["audio"]["asset"] == key
    # a second batch naming the same bytes from another folder adds no object
    other = tmp_path / "elsewhere"
    other.mkdir()
    shutil.copy(BED, other / "bed.ogg")
    (other / "m.yaml").write_text(four_videos("again", ["./bed.ogg"]))
    assert run_cli_here("submit", str(other / "m.yaml"), env=env).returncode == 0
    assert stored_files(tmp_path / "store") == [key]
    # nothing outside the manifest's folder, not even through a link
    (other / "escape.ogg").symlink_to(tmp_path / "beds" / "calm.ogg")
    (other / "bad.yaml").write_text(four_videos("escape", ["./escape.ogg"]))
    refused = run_cli_here("submit", str(other / "bad.yaml"), env=env)
    assert refused.returncode == 2
    escaped = "videos[0].audio.asset: ./escape.ogg leads out of the manifest's folder"
    assert escaped in refused.stderr


def test_a_missing_asset_is_refused_at_validate_submit_and_preload_with_nothing_written(
    tmp_path: Path, pg_url
):
    env = postgres_env(tmp_path, pg_url)
    store = tmp_path / "store"
    (store / "beds").mkdir(parents=True)
    shutil.copy(PULSE, store / "beds" / "pulse.ogg")
    shutil.copy(BED, tmp_path / "calm.ogg")
    manifest = tmp_path / "m.yaml"
    manifest.write_text(four_videos("typo", ["./calm.ogg", "beds/pulse.ogg", "", "beds/plse.ogg"]))
    before = stored_files(store)
    for command in ("validate", "submit", "preload"):
        refused = run_cli_here(command, str(manifest), env=env)
        assert refused.returncode == 2, (command, refused.stderr)
        assert "videos[3].audio.asset: beds/plse.ogg does not exist in the store" in refused.stderr
        assert "videos[1]" not in refused.stderr  # the good ones are not named
    assert job_rows(pg_url, "typo") == 0
    assert stored_files(store) == before  # the good local bed was not uploaded either
    missing_local = tmp_path / "local.yaml"
    missing_local.write_text(four_videos("typo", ["", "./beds/nowhere.ogg"]))
    refused = run_cli_here("submit", str(missing_local), env=env)
    assert refused.returncode == 2
    assert "videos[1].audio.asset: ./beds/nowhere.ogg does not exist" in refused.stderr
    assert job_rows(pg_url, "typo") == 0


def test_an_asset_in_defaults_is_named_where_it_is_written(tmp_path: Path, pg_url):
    env = postgres_env(tmp_path, pg_url)
    manifest = tmp_path / "m.yaml"
    manifest.write_text(
        four_videos("dflt", ["", ""]).replace("defaults: {", "defaults: {audio: {asset: x.ogg}, ")
    )
    refused = run_cli_here("validate", str(manifest), env=env)
    assert refused.returncode == 2
    assert "defaults.audio.asset: x.ogg does not exist in the store" in refused.stderr


def test_assets_on_the_s3_stand(tmp_path: Path, pg_url, s3_stand, bucket: str):
    store = S3Store(f"s3://{bucket}/factory", s3_stand.settings())
    store.put_file("beds/pulse.ogg", PULSE)
    env = postgres_env(tmp_path, pg_url, f"s3://{bucket}/factory") | s3_stand.env(
        f"s3://{bucket}/factory"
    )
    shutil.copy(BED, tmp_path / "calm.ogg")
    manifest = tmp_path / "m.yaml"
    manifest.write_text(
        four_videos("s3", ["beds/pulse.ogg", f"s3://{bucket}/factory/beds/pulse.ogg", "./calm.ogg"])
    )
    done = run_cli_here("submit", str(manifest), env=env)
    assert done.returncode == 0, done.stderr
    digest = hashlib.sha256(BED.read_bytes()).hexdigest()
    assert store.stat(f"assets/sha256/{digest}.ogg") is not None
    bad = tmp_path / "bad.yaml"
    bad.write_text(four_videos("s3bad", ["beds/pulse.ogg", f"s3://{bucket}/beds/gone.ogg"]))
    refused = run_cli_here("submit", str(bad), env=env)
    assert refused.returncode == 2
    assert f"videos[1].audio.asset: s3://{bucket}/beds/gone.ogg does not exist" in refused.stderr
    assert job_rows(pg_url, "s3bad") == 0


def test_a_store_that_cannot_be_reached_is_exit_1_with_the_reason(
    tmp_path: Path, pg_url, s3_stand, bucket: str
):
    url = f"s3://{bucket}/factory"
    closed = f"https://127.0.0.1:{free_port()}"
    env = postgres_env(tmp_path, pg_url, url) | s3_stand.env(url, FACTORY_S3_ENDPOINT_URL=closed)
    env["FACTORY_S3_ATTEMPTS"] = "1"
    manifest = tmp_path / "m.yaml"
    manifest.write_text(four_videos("down", ["beds/pulse.ogg"]))
    for command in ("validate", "submit", "preload"):
        failed = run_cli_here(command, str(manifest), env=env)
        assert failed.returncode == 1, failed.stderr
        assert "videos[0].audio.asset" in failed.stderr
        assert "cannot be reached" in failed.stderr
        assert "the job waits" not in failed.stderr  # no job exists: a stage's words don't fit
        assert "internal error" not in failed.stderr.lower()
    assert job_rows(pg_url, "down") == 0


def model_manifest(batch: str, path: Path | str, segment: str = "") -> str:
    return (
        f"batch: {batch}\nvideos:\n  - id: v\n    duration: 10\n    fps: 16\n"
        f"    resolution: 320x192\n    prompt: 'a harbor'\n{segment}"
        f"    model: {{family: skyreels-v2-df, path: {path}}}\n"
    )


def fake_model_dir(root: Path, components: tuple[str, ...]) -> Path:
    root.mkdir(parents=True)
    index = {"_class_name": "SkyReelsV2DiffusionForcingPipeline"}
    for name in ("transformer", "vae", "scheduler", "text_encoder", "tokenizer"):
        index[name] = ["diffusers", "X"]
    (root / "model_index.json").write_text(json.dumps(index))
    for name in components:
        (root / name).mkdir()
    return root


@pytest.mark.parametrize(
    ("case", "exit_code", "message"),
    [
        ("complete", 0, None),
        ("no-text-encoder", 2, "videos[0].model.path: missing text_encoder"),
        ("no-index", 2, "videos[0].model.path: missing model_index.json"),
        ("absent", 2, "does not exist"),
        ("not-visible", 0, "warning: videos[0].model.path: /gpu-only/SkyReels is not visible"),
    ],
)
def test_model_directories_are_checked_where_visible(
    tmp_path: Path, pg_url, case: str, exit_code: int, message: str | None
):
    env = postgres_env(tmp_path, pg_url)
    models = tmp_path / "models"
    parts = ("transformer", "vae", "scheduler", "text_encoder", "tokenizer")
    path: Path | str = models / "SkyReels"
    if case == "complete":
        fake_model_dir(models / "SkyReels", parts)
    elif case == "no-text-encoder":
        fake_model_dir(models / "SkyReels", tuple(p for p in parts if p != "text_encoder"))
    elif case == "no-index":
        (models / "SkyReels").mkdir(parents=True)
    elif case == "absent":
        models.mkdir()
    else:
        path = "/gpu-only/SkyReels"
    manifest = tmp_path / "m.yaml"
    manifest.write_text(model_manifest("models", path))
    for command in ("validate", "submit"):
        result = run_cli_here(command, str(manifest), env=env)
        assert result.returncode == exit_code, result.stderr
        if message:
            assert message in " ".join(result.stderr.split())
    assert job_rows(pg_url, "models") == (1 if exit_code == 0 else 0)
    if case == "absent":
        assert "missing" not in result.stderr


def test_the_family_gives_the_segment_settings_a_manifest_leaves_out(tmp_path: Path, pg_url):
    env = postgres_env(tmp_path, pg_url)
    manifest = tmp_path / "m.yaml"
    manifest.write_text(model_manifest("fam", "/gpu-only/SkyReels"))
    shown = run_cli_here("validate", str(manifest), env=env)
    assert shown.returncode == 0, shown.stderr
    assert "97 frames, overlap 17" in shown.stdout
    spec = json.loads(run_cli_here("validate", str(manifest), "--json", env=env).stdout)[0]
    assert spec["segment"] == {"frames": 97, "overlap": 17}
    manifest.write_text(model_manifest("fam", "/gpu-only/SkyReels", "    segment: {frames: 24}\n"))
    spec = json.loads(run_cli_here("validate", str(manifest), "--json", env=env).stdout)[0]
    assert spec["segment"] == {"frames": 24, "overlap": 9}  # the largest 4k+1 that fits
    manifest.write_text(
        model_manifest("fam", "/gpu-only/SkyReels", "    segment: {frames: 97, overlap: 4}\n")
    )
    refused = run_cli_here("validate", str(manifest), env=env)
    assert refused.returncode == 2
    assert "videos[0].segment.overlap: 4 does not suit skyreels-v2-df" in refused.stderr


def test_a_lora_beside_the_manifest_goes_into_the_store_and_a_missing_one_is_named(
    tmp_path: Path, pg_url
):
    env = postgres_env(tmp_path, pg_url)
    (tmp_path / "loras").mkdir()
    style = tmp_path / "loras" / "style.safetensors"
    style.write_bytes(b"not really a LoRA, but preflight only hashes it" * 50)
    manifest = tmp_path / "m.yaml"

    def write(lora: str) -> None:
        with_lora = f"path: /gpu-only/SkyReels, lora: [{{asset: '{lora}'}}]}}"
        text = model_manifest("lora", "/gpu-only/SkyReels")
        manifest.write_text(text.replace("path: /gpu-only/SkyReels}", with_lora))

    for missing in ("./loras/typo.safetensors", "loras/not-in-store.safetensors"):
        write(missing)
        for command in ("validate", "submit"):
            refused = run_cli_here(command, str(manifest), env=env)
            assert refused.returncode == 2, refused.stderr
            assert "videos[0].model.lora[0].asset" in refused.stderr
            assert "does not exist" in refused.stderr
    assert job_rows(pg_url, "lora") == 0
    assert stored_files(tmp_path / "store") == []
    write("./loras/style.safetensors")
    done = run_cli_here("submit", str(manifest), env=env)
    assert done.returncode == 0, done.stderr
    key = f"assets/sha256/{hashlib.sha256(style.read_bytes()).hexdigest()}.safetensors"
    assert stored_files(tmp_path / "store") == [key]
    status = json.loads(run_cli_here("status", "lora.v", "--json", env=env).stdout)
    assert status["spec"]["model"]["loras"][0]["asset"] == key


# --- pictures, sounds and camera templates named remotely -----------------------------------


def png_bytes(size: tuple[int, int] = (64, 40)) -> bytes:
    raw = io.BytesIO()
    Image.new("RGB", size, (30, 120, 200)).save(raw, "PNG")
    return raw.getvalue()


def bomb_png() -> bytes:
    """A 40,000 x 40,000 PNG of a few hundred bytes (as tests/unit/test_images.py makes it)."""
    data = bytearray(png_bytes((1, 1)))
    ihdr = data.index(b"IHDR")
    data[ihdr + 4 : ihdr + 12] = struct.pack(">II", 40000, 40000)
    crc = zlib.crc32(bytes(data[ihdr : ihdr + 17])) & 0xFFFFFFFF
    data[ihdr + 17 : ihdr + 21] = struct.pack(">I", crc)
    return bytes(data)


def scenes_manifest(
    batch: str,
    first: str | None = None,
    second: str | None = None,
    camera: str | None = None,
    cue: str | None = None,
    bed: str | None = None,
) -> str:
    """One procedural video of two shots; each asset given is named in its field:
    videos[0].scenes[0].image.asset, .scenes[1].image.asset, .scenes[1].camera.asset,
    videos[0].audio.cues[0].asset, videos[0].audio.asset."""
    second_scene = "{start: 3, prompt: a quiet harbor, join: cut"
    second_scene += f", image: {{asset: '{second}', as: reference}}" if second else ""
    second_scene += f", camera: {{asset: '{camera}'}}" if camera else ""
    lines = [
        f"batch: {batch}",
        "videos:",
        "  - id: v",
        "    duration: 6",
        "    fps: 12",
        "    resolution: 320x192",
        "    segment: {frames: 24, overlap: 4}",
        "    model: procedural",
        "    scenes:",
        "      - {start: 0, prompt: a bright studio"
        + (f", image: {{asset: '{first}'}}}}" if first else "}"),
        f"      - {second_scene}}}",
    ]
    audio = [f"asset: '{bed}'"] if bed else []
    audio += [f"cues: [{{at: 1, asset: '{cue}'}}]"] if cue else []
    lines += [f"    audio: {{{', '.join(audio)}}}"] if audio else []
    return "\n".join(lines) + "\n"


FIRST = "videos[0].scenes[0].image.asset"
SECOND = "videos[0].scenes[1].image.asset"
CAMERA = "videos[0].scenes[1].camera.asset"
CUE = "videos[0].audio.cues[0].asset"
BED_FIELD = "videos[0].audio.asset"


@pytest.mark.parametrize(
    "case", ["undecodable-picture", "bomb", "undecodable-cue", "bad-camera-by-file-url"]
)
def test_a_remote_asset_that_does_not_decode_is_refused_naming_each_field_with_nothing_written(
    tmp_path: Path, pg_url, case: str
):
    env = postgres_env(tmp_path, pg_url)
    store = FileStore(tmp_path / "store")
    if case == "undecodable-picture":  # named by both scenes: both fields are named
        store.put_bytes("pics/three.png", b"PNG")
        text_ = scenes_manifest(case, first="pics/three.png", second="pics/three.png")
        said = [f"{FIRST}: pics/three.png is not a picture",
                f"{SECOND}: pics/three.png is not a picture"]  # fmt: skip
    elif case == "bomb":
        store.put_bytes("pics/bomb.png", bomb_png())
        text_ = scenes_manifest(case, second="pics/bomb.png")
        said = [f"{SECOND}: pics/bomb.png is a decompression bomb"]
    elif case == "undecodable-cue":
        store.put_bytes("cues/noise.ogg", b"OggS and then nothing a decoder could use" * 20)
        text_ = scenes_manifest(case, cue="cues/noise.ogg")
        said = [f"{CUE}: cues/noise.ogg does not decode as audio"]
    else:
        (tmp_path / "templates").mkdir()
        (tmp_path / "templates" / "pan.mkv").write_bytes(b"not a video")
        url = (tmp_path / "templates" / "pan.mkv").as_uri()
        text_ = scenes_manifest("file-url", camera=url)
        said = [f"{CAMERA}: {url} is not a video file"]
    manifest = tmp_path / "m.yaml"
    manifest.write_text(text_)
    before = stored_files(tmp_path / "store")
    for command in ("validate", "submit"):
        refused = run_cli_here(command, str(manifest), env=env)
        assert refused.returncode == 2, (command, refused.stderr)
        for words in said:
            assert words in refused.stderr, refused.stderr
    assert job_rows(pg_url, text_.split()[1]) == 0
    assert stored_files(tmp_path / "store") == before


def test_good_remote_pictures_sounds_and_templates_are_accepted(tmp_path: Path, pg_url):
    env = postgres_env(tmp_path, pg_url)
    store = FileStore(tmp_path / "store")
    store.put_bytes("pics/good.png", png_bytes())
    store.put_file("beds/pulse.ogg", PULSE)
    pan_template(tmp_path / "pan.mkv")
    manifest = tmp_path / "m.yaml"
    manifest.write_text(
        scenes_manifest("good", first="pics/good.png", second="pics/good.png",
                        camera=(tmp_path / "pan.mkv").as_uri(), cue="beds/pulse.ogg")
    )  # fmt: skip
    done = run_cli_here("submit", str(manifest), env=env)
    assert done.returncode == 0, done.stderr
    assert job_rows(pg_url, "good") == 1
    status = json.loads(run_cli_here("status", "good.v", "--json", env=env).stdout)
    assert status["spec"]["scenes"][0]["image"]["asset"] == "pics/good.png"


def test_remote_pictures_on_the_s3_stand_are_decoded_by_key_and_by_s3_url(
    tmp_path: Path, pg_url, s3_stand, bucket: str
):
    url = f"s3://{bucket}/factory"
    store = S3Store(url, s3_stand.settings())
    store.put_bytes("pics/three.png", b"PNG")
    store.put_bytes("pics/bomb.png", bomb_png())
    store.put_bytes("pics/good.png", png_bytes())
    env = postgres_env(tmp_path, pg_url, url) | s3_stand.env(url)
    manifest = tmp_path / "m.yaml"
    manifest.write_text(scenes_manifest("s3pic", "pics/three.png", f"{url}/pics/bomb.png"))
    for command in ("validate", "submit"):
        refused = run_cli_here(command, str(manifest), env=env)
        assert refused.returncode == 2, (command, refused.stderr)
        assert f"{FIRST}: pics/three.png is not a picture" in refused.stderr
        assert f"{SECOND}: {url}/pics/bomb.png is a decompression bomb" in refused.stderr
    manifest.write_text(scenes_manifest("s3pic", f"{url}/pics/three.png", "pics/good.png"))
    refused = run_cli_here("submit", str(manifest), env=env)
    assert refused.returncode == 2, refused.stderr
    assert f"{FIRST}: {url}/pics/three.png is not a picture" in refused.stderr
    assert SECOND not in refused.stderr  # the good one is not named
    assert job_rows(pg_url, "s3pic") == 0
    manifest.write_text(scenes_manifest("s3pic", "pics/good.png", f"{url}/pics/good.png"))
    done = run_cli_here("submit", str(manifest), env=env)
    assert done.returncode == 0, done.stderr
    assert job_rows(pg_url, "s3pic") == 1


class Watched:
    """A real store that notes each object fetched from it (local_path), and can be made to
    fail there as an unreachable one does."""

    def __init__(self, store: FileStore, fail: Exception | None = None) -> None:
        self.store, self.url, self.fail = store, store.url, fail
        self.fetched: list[str] = []

    def __getattr__(self, name: str):
        return getattr(self.store, name)

    @contextmanager
    def local_path(self, key: str) -> Iterator[Path]:
        self.fetched.append(key)
        if self.fail is not None:
            raise self.fail
        with self.store.local_path(key) as path:
            yield path


@pytest.mark.parametrize(
    ("field", "limit", "key"),
    [
        (FIRST, MAX_IMAGE_BYTES, "pics/huge.png"),
        (CUE, MAX_SOUND_BYTES, "cues/huge.ogg"),
        (CAMERA, MAX_CONTROL_BYTES, "moves/huge.mkv"),
    ],
)
def test_an_object_over_the_limit_is_refused_by_its_size_without_download(
    tmp_path: Path, field: str, limit: int, key: str
):
    store = FileStore(tmp_path / "store")
    store.put_bytes(key, b"")
    with open(store.path(key), "r+b") as out:  # sparse: the size the store reports
        out.truncate(limit + (1 << 20))
    watched = Watched(store)
    arguments = {FIRST: "first", CUE: "cue", CAMERA: "camera"}[field]
    (tmp_path / "m.yaml").write_text(scenes_manifest("huge", **{arguments: key}))
    with pytest.raises(ManifestError) as refused:
        preflight.check(load_manifest(tmp_path / "m.yaml"), lambda: watched,
                        confinement=Confinement())  # fmt: skip
    said = f"{key} is {(limit >> 20) + 1} MiB; at most {limit >> 20} MiB"
    assert [(p.path, p.message) for p in refused.value.problems] == [(field, said)]
    assert watched.fetched == []


def test_each_remote_asset_is_downloaded_once_however_many_fields_name_it(
    tmp_path: Path, s3_stand, bucket: str, monkeypatch
):
    url = f"s3://{bucket}/factory"
    settings = s3_stand.settings()
    store = S3Store(url, settings)
    store.put_bytes("pics/good.png", png_bytes())
    store.put_file("beds/pulse.ogg", PULSE)
    fetched: list[str] = []
    real = S3Store.local_path

    def watched(self: S3Store, key: str):
        fetched.append(self.url_for(key))
        return real(self, key)

    monkeypatch.setattr(S3Store, "local_path", watched)
    (tmp_path / "m.yaml").write_text(
        scenes_manifest("once", "pics/good.png", f"{url}/pics/good.png",
                        bed="beds/pulse.ogg", cue="beds/pulse.ogg")
    )  # fmt: skip
    checked = preflight.check(
        load_manifest(tmp_path / "m.yaml"), lambda: S3Store(url, settings),
        confinement=Confinement(asset_buckets=(bucket,)), s3=settings,
    )  # fmt: skip
    assert checked.manifest.videos[0].scenes[0].image.asset == "pics/good.png"
    assert sorted(fetched) == [f"{url}/beds/pulse.ogg", f"{url}/pics/good.png"]


def test_a_store_that_fails_while_an_asset_is_fetched_is_unreachable_not_a_pass(tmp_path: Path):
    store = FileStore(tmp_path / "store")
    store.put_bytes("pics/good.png", png_bytes())
    watched = Watched(store, fail=RetryableError("get: timed out", reason="timed out"))
    (tmp_path / "m.yaml").write_text(scenes_manifest("down", second="pics/good.png"))
    with pytest.raises(preflight.StoreUnreachable) as failed:
        preflight.check(load_manifest(tmp_path / "m.yaml"), lambda: watched,
                        confinement=Confinement())  # fmt: skip
    assert f"cannot check {SECOND} (pics/good.png)" in str(failed.value)
    assert "cannot be reached: timed out" in str(failed.value)
