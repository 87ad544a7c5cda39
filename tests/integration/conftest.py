"""Fixtures shared by the integration tests: a real factory cluster, and a fresh bucket on
the S3 stand (tests/s3stand.py, behind the mutual-TLS gateway)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.integration.cluster import Cluster, new_cluster


@pytest.fixture
def cluster(tmp_path: Path, pg_url: str) -> Iterator[Cluster]:
    made = new_cluster(tmp_path, pg_url)
    yield made
    made.stop()
    redis.Redis.from_url(made.broker).flushdb()


@pytest.fixture
def bucket(s3_stand) -> str:
    return s3_stand.make_bucket(f"b-{uuid.uuid4().hex[:12]}")
