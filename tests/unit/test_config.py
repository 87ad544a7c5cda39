from __future__ import annotations

from pathlib import Path

import pytest

from factory.config import Settings
from factory.errors import ConfigError


def test_embedded_defaults_live_under_factory_home(tmp_path: Path):
    settings = Settings.from_env({"FACTORY_HOME": str(tmp_path)})
    assert settings.database_url == f"sqlite:///{tmp_path / 'factory.db'}"
    assert settings.store_url == (tmp_path / "store").as_uri()
    assert settings.broker_url is None and settings.redis_url is None
    assert (settings.stale_after, settings.sweep_every) == (300, 30)
    assert settings.is_embedded_database


def test_production_values_are_taken_as_given():
    settings = Settings.from_env(
        {
            "FACTORY_DATABASE_URL": "postgresql+psycopg2://u@db/factory",
            "FACTORY_BROKER_URL": "redis://r:6379/0",
            "FACTORY_REDIS_URL": "redis://r:6379/1",
            "FACTORY_STORE_URL": "s3://bucket/prefix",
            "FACTORY_STALE_AFTER": "120",
            "FACTORY_SWEEP_EVERY": "10",
        }
    )
    assert not settings.is_embedded_database
    assert (settings.stale_after, settings.sweep_every) == (120, 10)


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("FACTORY_STALE_AFTER", "five", "whole number"),
        ("FACTORY_SWEEP_EVERY", "0", "must be > 0"),
        ("FACTORY_DATABASE_URL", "mysql://x/y", "not supported"),
        ("FACTORY_STORE_URL", "ftp://x/y", "not supported"),
        ("FACTORY_REDIS_URL", "localhost:6379", "redis://"),
        ("FACTORY_VAE_TILING", "maybe", "true/false"),
        ("FACTORY_GROUP_OFFLOAD", "half", "off, block, leaf"),
        ("FACTORY_LAYERWISE_CASTING", "fp4", "off, fp8"),
        ("FACTORY_EMBEDDING_CACHE", "redis", "FACTORY_REDIS_URL is not set"),
        ("FACTORY_EMBEDDING_CACHE_BYTES", "lots", "whole number of bytes"),
        ("FACTORY_TEXT_ENCODER_DEVICE", "tpu", "cpu or cuda"),
        ("FACTORY_STALE_AFTER", "60", "at least 3 times FACTORY_HEARTBEAT_EVERY (30 s)"),
        ("FACTORY_GIVE_UP_AFTER", "0", "must be > 0"),
        ("FACTORY_DB_IDLE_TIMEOUT", "-1", "0: no limit"),
        ("FACTORY_DB_STATEMENT_TIMEOUT", "soon", "whole number of seconds"),
    ],
)
def test_bad_values_name_the_variable(name: str, value: str, says: str):
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({name: value})
    assert caught.value.field == name and says in str(caught.value)
    assert caught.value.exit_code == 2


def test_memory_governance_and_the_embedding_cache_from_settings():
    settings = Settings.from_env(
        {
            "FACTORY_VAE_TILING": "yes",
            "FACTORY_GROUP_OFFLOAD": "block",
            "FACTORY_LAYERWISE_CASTING": "fp8",
            "FACTORY_EMBEDDING_CACHE": "redis",
            "FACTORY_REDIS_URL": "redis://r:6379/1",
            "FACTORY_EMBEDDING_CACHE_BYTES": "1048576",
        }
    )
    policy = settings.memory_policy
    assert (policy.vae_tiling, policy.group_offload, policy.layerwise_casting) == (
        True,
        "block",
        "fp8",
    )
    assert (settings.embedding_cache, settings.embedding_cache_bytes) == ("redis", 1 << 20)
    default = Settings.from_env({})
    assert default.memory_policy.group_offload == "auto" and default.embedding_cache == "store"


def test_s3_settings_from_the_environment(tmp_path: Path):
    for name in ("ca.pem", "w.pem", "w.key"):
        (tmp_path / name).write_text("x")
    settings = Settings.from_env(
        {
            "FACTORY_HOME": str(tmp_path),
            "FACTORY_STORE_URL": "s3://render-out/nightly",
            "FACTORY_S3_ENDPOINT_URL": "https://gw.internal:8443",
            "FACTORY_S3_CA": str(tmp_path / "ca.pem"),
            "FACTORY_S3_CLIENT_CERT": str(tmp_path / "w.pem"),
            "FACTORY_S3_CLIENT_KEY": str(tmp_path / "w.key"),
            "FACTORY_S3_CHECKSUMS": "when_required",
            "FACTORY_S3_MULTIPART_BYTES": str(64 << 20),
            "FACTORY_S3_VERIFY": "download",
            "FACTORY_NODE_NAME": "gpu-b",
            "FACTORY_NODES": "gpu-a, gpu-b,gpu-c",
        }
    )
    s3 = settings.s3
    assert (s3.endpoint_url, s3.client_cert, s3.client_key) == (
        "https://gw.internal:8443", tmp_path / "w.pem", tmp_path / "w.key"
    )  # fmt: skip
    assert (s3.checksums, s3.multipart_bytes, s3.verify) == ("when_required", 64 << 20, "download")
    assert (s3.addressing, s3.region, s3.scratch) == ("path", "us-east-1", tmp_path / "tmp")
    assert settings.nodes == ("gpu-a", "gpu-b", "gpu-c") and settings.node_name == "gpu-b"
    assert "w.key" not in s3.describe()  # paths of what to check, never the key


@pytest.mark.parametrize(
    ("env", "field", "says"),
    [
        ({"FACTORY_S3_CA": "/nonexistent/ca.pem"}, "FACTORY_S3_CA", "not a readable file"),
        ({"FACTORY_S3_CLIENT_CERT": "{ca}"}, "FACTORY_S3_CLIENT_KEY", "goes with its key"),
        ({"FACTORY_S3_CLIENT_KEY": "{ca}"}, "FACTORY_S3_CLIENT_CERT", "goes with its key"),
        (
            {
                "FACTORY_S3_CLIENT_CERT": "{ca}",
                "FACTORY_S3_CLIENT_KEY": "{ca}",
                "FACTORY_S3_ENDPOINT_URL": "http://gw:9000",
            },
            "FACTORY_S3_ENDPOINT_URL",
            "mutual TLS needs https://",
        ),
        ({"FACTORY_S3_ENDPOINT_URL": "gw:8443"}, "FACTORY_S3_ENDPOINT_URL", "https:// URL"),
        ({"FACTORY_S3_PART_BYTES": "1048576"}, "FACTORY_S3_PART_BYTES", "at least 5 MiB"),
        ({"FACTORY_S3_VERIFY": "hope"}, "FACTORY_S3_VERIFY", "etag, download"),
        ({"FACTORY_S3_BACKOFF": "-1"}, "FACTORY_S3_BACKOFF", "must be > 0"),
        ({"FACTORY_STORE_URL": "s3://Bad_Bucket/x"}, "FACTORY_STORE_URL", "valid bucket"),
        ({"FACTORY_STORE_URL": "s3://bucket/../up"}, "FACTORY_STORE_URL", "no '..'"),
        ({"FACTORY_NODE_NAME": "a", "FACTORY_NODES": "b,c"}, "FACTORY_NODES", "does not list"),
        ({"FACTORY_NODE_NAME": "bad name"}, "FACTORY_NODE_NAME", "A-Z a-z"),
    ],
)
def test_bad_s3_and_node_settings_name_the_variable(tmp_path: Path, env, field, says):
    (tmp_path / "ca.pem").write_text("x")
    env = {k: v.format(ca=tmp_path / "ca.pem") for k, v in env.items()}
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(env)
    assert caught.value.field == field and says in str(caught.value)


def test_the_file_store_syncs_every_write_unless_told_not_to(tmp_path: Path):
    from factory.store import open_store

    assert Settings.from_env({}).store_fsync is True
    off = Settings.from_env({"FACTORY_STORE_FSYNC": "0"})
    assert off.store_fsync is False
    assert open_store((tmp_path / "s").as_uri(), durable=off.store_fsync).durable is False
    assert open_store((tmp_path / "s").as_uri()).durable is True


def test_the_webhook_must_be_https_except_to_this_host(tmp_path: Path):
    for url in ("http://hooks.example.com/x", "http://10.0.0.5/x", "ftp://h/x"):
        with pytest.raises(ConfigError) as caught:
            Settings.from_env({"FACTORY_HOME": str(tmp_path), "FACTORY_WEBHOOK_URL": url})
        assert caught.value.field == "FACTORY_WEBHOOK_URL" and "https://" in str(caught.value)
    for url in ("https://hooks.example.com/x", "http://127.0.0.1:8080/x", "http://[::1]/x",
                "http://localhost/x"):  # fmt: skip
        env = {"FACTORY_HOME": str(tmp_path), "FACTORY_WEBHOOK_URL": url}
        assert Settings.from_env(env).webhook.url == url


def test_confinement_defaults_and_bad_values(tmp_path: Path):
    plain = Settings.from_env({"FACTORY_HOME": str(tmp_path)}).confinement
    assert plain.asset_roots == () and plain.asset_buckets == ()
    assert plain.model_roots == (Path("/models"), tmp_path / "models")
    s3 = Settings.from_env({"FACTORY_HOME": str(tmp_path), "FACTORY_STORE_URL": "s3://renders/x"})
    assert s3.confinement.asset_buckets == ("renders",)
    for name, value in (("FACTORY_ASSET_ROOTS", "relative/dir"), ("FACTORY_MODEL_ROOTS", "/"),
                        ("FACTORY_ASSET_BUCKETS", "Not_A_Bucket")):  # fmt: skip
        with pytest.raises(ConfigError) as caught:
            Settings.from_env({"FACTORY_HOME": str(tmp_path), name: value})
        assert caught.value.field == name


def test_group_offload_auto_is_off_without_cuda():
    from factory.generate.memory import MemoryPolicy

    policy = MemoryPolicy()
    assert policy.group_offload == "auto"
    assert policy.offload_on("cpu") == "off" and policy.describe("cpu")["group_offload"] == "off"
    assert MemoryPolicy(group_offload="block").offload_on("cpu") == "block"


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"FACTORY_REVIEW": "sometimes"}, "FACTORY_REVIEW"),
        ({"FACTORY_CONSOLE_SECURE_COOKIES": "yes"}, "FACTORY_CONSOLE_SECURE_COOKIES"),
        ({"FACTORY_CONSOLE_WINDOW": "22-06"}, "FACTORY_CONSOLE_WINDOW"),
        ({"FACTORY_CONSOLE_SESSION_HOURS": "0"}, "FACTORY_CONSOLE_SESSION_HOURS"),
        ({"FACTORY_CONSOLE_LIVE_EVERY": "fast"}, "FACTORY_CONSOLE_LIVE_EVERY"),
    ],
)
def test_bad_console_settings_name_the_variable(tmp_path: Path, env, field):
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"FACTORY_HOME": str(tmp_path), **env})
    assert caught.value.field == field


def test_console_defaults_and_review(tmp_path: Path):
    console = Settings.from_env({"FACTORY_HOME": str(tmp_path)}).console
    assert (console.review_required, console.secure_cookies, console.live_every) == (
        False,
        "auto",
        1.0,
    )
    env = {"FACTORY_HOME": str(tmp_path), "FACTORY_REVIEW": "required",
           "FACTORY_CONSOLE_WINDOW": "22:00-06:00"}  # fmt: skip
    console = Settings.from_env(env).console
    assert console.review_required and console.window == "22:00-06:00"


def test_what_factory_worker_sets_for_its_process_is_read_by_config_alone(tmp_path) -> None:
    """config.py is the only reader of the environment (issue 36): the worker's own queue,
    its GPU's index, the models it preloads and Flower's password are settings too."""
    from factory.config import Settings
    from factory.errors import ConfigError

    env = {"FACTORY_HOME": str(tmp_path), "FACTORY_GPU_QUEUE": "gpu.host.1",
           "FACTORY_GPU_INDEX": "3", "FACTORY_PRELOAD_MODELS": "wan:/m/wan,ltx:/m/ltx",
           "FACTORY_FLOWER_BASIC_AUTH": "ops:s3cret"}  # fmt: skip
    settings = Settings.from_env(env)
    assert (settings.gpu_queue, settings.gpu_index) == ("gpu.host.1", 3)
    assert settings.preload_models == ("wan:/m/wan", "ltx:/m/ltx")
    assert settings.flower_basic_auth == "ops:s3cret" and "s3cret" not in repr(settings)
    with pytest.raises(ConfigError) as bad:
        Settings.from_env({**env, "FACTORY_GPU_INDEX": "GPU-3"})
    assert bad.value.field == "FACTORY_GPU_INDEX"


def _as_another_user(call) -> str:
    """What `call()` raises (its text), run in a child that is not the file's owner: as
    root, a forked child that drops to nobody (root reads any file)."""
    import os

    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (the child)
        os.close(read)
        said = "nothing"
        try:
            if os.getuid() == 0:
                os.setgroups([])
                os.setresgid(65534, 65534, 65534)
                os.setresuid(65534, 65534, 65534)
            call()
        except Exception as exc:  # what the parent asserts on
            said = f"{type(exc).__name__}: {exc}"
        os.write(write, said.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read().decode()
    os.waitpid(child, 0)
    return said


def test_a_client_key_the_factory_user_cannot_read_is_named_with_its_fix():
    """Issue 50, item 4: a key written 0600 root (as make-certs does) passed the check (the
    file exists), and a delivery then said "cannot reach the S3 endpoint": an outage."""
    import shutil
    import tempfile

    from factory.config.s3 import parse

    folder = Path(tempfile.mkdtemp(prefix="pki-"))  # one that nobody may enter (not tmp_path)
    folder.chmod(0o755)
    try:
        _check_the_key_as_another_user(folder, parse)
    finally:
        shutil.rmtree(folder)


def _check_the_key_as_another_user(tmp_path: Path, parse) -> None:
    import os

    key, cert = tmp_path / "worker.key", tmp_path / "worker.pem"
    key.write_text("-----BEGIN PRIVATE KEY-----\n")
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    key.chmod(0o600)
    if os.getuid() != 0:
        key.chmod(0o000)
    env = {"FACTORY_S3_ENDPOINT_URL": "https://gw:9443", "FACTORY_S3_CLIENT_CERT": str(cert),
           "FACTORY_S3_CLIENT_KEY": str(key)}  # fmt: skip
    said = _as_another_user(lambda: parse(env, tmp_path))
    assert said.startswith("ConfigError: "), said
    assert "FACTORY_S3_CLIENT_KEY" in said and f"{key} cannot be read by uid" in said, said
    assert "chown" in said and "chmod 600" in said, said
