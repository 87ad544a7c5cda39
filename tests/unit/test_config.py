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
    assert default.memory_policy.group_offload == "off" and default.embedding_cache == "store"
