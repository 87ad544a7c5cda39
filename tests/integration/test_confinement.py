"""A manifest cannot make the factory read outside what the operator allowed, and a spec
changed in the database is checked again before anything uses it.

- At validate/submit: a file:// asset outside FACTORY_ASSET_ROOTS (none by default), a model
  directory outside FACTORY_MODEL_ROOTS, an s3:// bucket not in FACTORY_ASSET_BUCKETS: exit 2
  naming the field; nothing is created.
- On the worker: the same rules before a file is opened, and the manifest rules re-applied to
  the spec read back from PostgreSQL (an id with `../`, a gain that is not a number).
- The asset cache is private: folders 0700, files 0600, whatever the source's mode was.

Real CLI, real PostgreSQL."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from factory.db.session import Database
from factory.db.state import JobStateMachine
from factory.infra.confinement import Confinement, OutsideConfinement
from factory.manifest import StoredSpecError, parse_manifest
from factory.ops.submit import submit
from factory.spec import ModelChoice
from factory.store.assets import AssetCache
from factory.store.file import FileStore
from tests.conftest import embedded_env, run_cli_here
from tests.footage import tone


def _manifest(path: Path, extra: str, model: str = "procedural") -> Path:
    path.write_text(
        "batch: conf\n"
        f"defaults: {{duration: 2, fps: 8, resolution: 96x64, model: {model}}}\n"
        f"videos:\n  - {{id: v0, prompt: p{extra}}}\n"
    )
    return path


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {**embedded_env(tmp_path / "home"), "FACTORY_ASSET_ROOTS": "", "FACTORY_MODEL_ROOTS": ""}
    return {**env, **extra}


def test_a_file_asset_outside_the_allowed_roots_is_refused_at_validate(tmp_path: Path):
    secret = _manifest(tmp_path / "m.yaml", ", audio: {asset: 'file:///proc/self/environ'}")
    done = run_cli_here("validate", str(secret), env=_env(tmp_path))
    assert done.returncode == 2, done.stderr
    assert "videos[0].audio.asset" in done.stderr and "FACTORY_ASSET_ROOTS" in done.stderr
    allowed = tmp_path / "beds"
    allowed.mkdir()
    tone(allowed / "bed.ogg")  # submit decodes it: a real sound
    (allowed / "escape.ogg").symlink_to("/etc/hostname")  # a link out of the root
    env = _env(tmp_path, FACTORY_ASSET_ROOTS=str(allowed))
    still = run_cli_here("validate", str(secret), env=env)
    assert still.returncode == 2 and "outside the allowed asset folders" in still.stderr
    linked = _manifest(tmp_path / "l.yaml", f", audio: {{asset: 'file://{allowed}/escape.ogg'}}")
    assert run_cli_here("validate", str(linked), env=env).returncode == 2
    inside = _manifest(tmp_path / "i.yaml", f", audio: {{asset: 'file://{allowed}/bed.ogg'}}")
    assert run_cli_here("validate", str(inside), env=env).returncode == 0
    submitted = run_cli_here("submit", str(secret), env=env)
    assert submitted.returncode == 2
    assert run_cli_here("jobs", env=env).stdout.count("conf.v0") == 0  # nothing was created


def test_a_model_directory_outside_the_allowed_roots_is_refused(tmp_path: Path):
    model = "{family: wan, path: /etc}"
    path = _manifest(tmp_path / "m.yaml", "", model=model)
    done = run_cli_here("validate", str(path), env=_env(tmp_path))
    assert done.returncode == 2, done.stderr
    assert "videos[0].model.path" in done.stderr or "defaults.model.path" in done.stderr
    assert "FACTORY_MODEL_ROOTS" in done.stderr and "/models" in done.stderr


def test_a_bucket_that_is_not_allowed_is_refused_before_the_store_is_asked(tmp_path: Path):
    path = _manifest(tmp_path / "m.yaml", ", audio: {asset: 's3://other-team/beds/calm.ogg'}")
    done = run_cli_here("validate", str(path), env=_env(tmp_path))
    assert done.returncode == 2, done.stderr
    assert "bucket 'other-team' is not allowed" in done.stderr
    assert "videos[0].audio.asset" in done.stderr


def test_the_asset_cache_is_private_whatever_the_source_mode(tmp_path: Path):
    source = tmp_path / "beds" / "private.ogg"
    source.parent.mkdir()
    tone(source)
    source.chmod(0o600)
    path = _manifest(tmp_path / "m.yaml", f", audio: {{asset: '{source.as_uri()}'}}")
    env = _env(tmp_path, FACTORY_ASSET_ROOTS=str(source.parent))
    done = run_cli_here("preload", str(path), env=env)
    assert done.returncode == 0, done.stderr
    cache = tmp_path / "home" / "assets"
    objects = [p for p in (cache / "objects").iterdir() if p.is_file()]
    assert objects and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in objects)
    assert stat.S_IMODE((cache / "index.json").stat().st_mode) == 0o600
    for folder in (cache, cache / "objects", cache / "locks"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder


def test_the_worker_refuses_what_the_spec_may_not_name(tmp_path: Path):
    cache = AssetCache(tmp_path / "assets", 1 << 20, FileStore(tmp_path / "store"),
                       confinement=Confinement(asset_roots=(tmp_path / "beds",)))  # fmt: skip
    with pytest.raises(OutsideConfinement, match="outside the allowed asset folders"):
        cache._ensure("file:///proc/self/environ")
    with pytest.raises(OutsideConfinement, match="bucket 'anything' is not allowed"):
        cache._ensure("s3://anything/key.ogg")
    with pytest.raises(OutsideConfinement, match="FACTORY_MODEL_ROOTS"):
        Confinement().check_model(str(tmp_path / "models" / "wan"))
    Confinement(model_roots=(tmp_path,)).check_model(str(tmp_path / "models" / "wan"))
    assert ModelChoice("wan", "/models/x").path  # the default root admits /models


@pytest.fixture
def pg_machine(pg_url: str) -> JobStateMachine:
    from factory.db import migrate

    database = Database(pg_url)
    migrate.upgrade(database)
    return JobStateMachine(database)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"video_id": "../../escape"}, "videos[0].id"),
        ({"batch": "a:b"}, "batch"),
        ({"audio": {"asset": "beds/x.ogg", "gain_db": "0,volume=100", "loop": True}}, "gain_db"),
        ({"fps": 10**6}, "fps"),
        ({"model": {"family": "../../bin/sh"}}, "model.family"),
        ({"segment": {"frames": 8, "overlap": 7}}, "overlap"),
    ],
)
def test_a_spec_changed_in_the_database_is_refused_when_read_back(
    pg_machine: JobStateMachine, pg_url: str, batch_name: str, change: dict, named: str
):
    manifest = parse_manifest(
        f"batch: {batch_name}\n"
        "defaults: {duration: 2, fps: 8, resolution: 96x64, segment: {frames: 8, overlap: 2}}\n"
        "videos:\n  - {id: v0, prompt: p, audio: {asset: beds/x.ogg}}\n"
    )
    [job] = submit(manifest, pg_machine, None).jobs
    assert job.video.video_id == "v0"  # what submit wrote passes
    engine = create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE jobs SET spec = :s WHERE job_id = :j"),
                     {"s": json.dumps({**job.spec, **change}), "j": job.job_id})  # fmt: skip
    engine.dispose()
    tampered = pg_machine.get(job.job_id)
    with pytest.raises(StoredSpecError, match=r"breaks the manifest rules|malformed") as refused:
        _ = tampered.video
    assert named in str(refused.value) or "malformed" in str(refused.value)
    with pytest.raises(StoredSpecError):
        _ = tampered.video_id  # the raw id never reaches a path
