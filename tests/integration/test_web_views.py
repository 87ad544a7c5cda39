"""The web's views over the operations layer in-process (FastAPI's TestClient): a job's
media served from the store by the rules in factory/ops/media.py, and the seam ranking the
video page shows, scored by the quality gate's own limits. The tests that need a real
server process (sign-in, hostile clients, the browser) are test_console_*, test_web_hostile
and test_embedded_serve."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from factory.access import Access
from factory.config import Settings
from factory.job import SegmentRecord
from factory.media.presets import PRESETS
from factory.ops.media import JobFiles
from factory.ops.views import JobView
from factory.qc.thresholds import QcThresholds
from factory.store import open_store
from factory.wiring import Factory
from tests.conftest import HomeSnapshot, embedded_env
from tests.integration.test_operations import _deliver, operations

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def delivered_home(tmp_path_factory) -> HomeSnapshot:
    return HomeSnapshot(tmp_path_factory.mktemp("views-v1"), _deliver)


@pytest.fixture
def served(delivered_home) -> Iterator[tuple[TestClient, dict[str, str], Settings]]:
    from factory.web.server import create_app

    home = delivered_home.restore()
    settings = Settings.from_env(embedded_env(home))
    factory = Factory.open(settings)
    _, token = Access(factory.database).create_token("views", "viewer")
    with TestClient(create_app(settings, factory=factory)) as client:
        yield client, {"Authorization": f"Bearer {token}"}, settings


def _stored(settings: Settings, key: str) -> bytes:
    store = open_store(settings.store_url, settings.s3)
    with store.local_path(key) as path:
        return Path(path).read_bytes()


def test_a_rendition_is_served_whole_by_range_and_by_head(served) -> None:
    client, auth, settings = served
    job = operations(settings.home).job("ops.clip")
    found = JobFiles(open_store(settings.store_url, settings.s3)).find(job, "mobile.mp4")
    assert found is not None and found.content_type == "video/mp4"
    stored = _stored(settings, found.key)

    whole = client.get("/media/ops.clip/mobile.mp4", headers=auth)
    assert whole.status_code == 200 and whole.content == stored
    part = client.get("/media/ops.clip/mobile.mp4", headers=auth | {"Range": "bytes=10-109"})
    assert part.status_code == 206 and part.content == stored[10:110]
    assert part.headers["content-range"] == f"bytes 10-109/{len(stored)}"
    head = client.head("/media/ops.clip/mobile.mp4", headers=auth)
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == str(len(stored))
    past = client.get("/media/ops.clip/mobile.mp4", headers=auth | {"Range": f"bytes={10**9}-"})
    assert past.status_code == 416


@pytest.mark.parametrize("name", ["web.mp4", "..%2Ffactory.db", "clip.json", "seam-99.png"])
def test_nothing_but_the_jobs_own_files_is_served(served, name: str) -> None:
    client, auth, _ = served
    assert client.get(f"/media/ops.clip/{name}", headers=auth).status_code == 404


def test_no_media_without_a_token(served) -> None:
    client, _, _ = served
    assert client.get("/media/ops.clip/mobile.mp4").status_code in (401, 403)


def test_pictures_thumbnail_and_seams_are_pngs(served) -> None:
    client, auth, settings = served
    view = operations(settings.home).job_view("ops.clip")
    assert view.seams, "the tiny video has seams"
    for name in ["contact.png", "quality.png", "thumb.png", f"seam-{view.seams[0]['seam']}.png"]:
        answer = client.get(f"/media/ops.clip/{name}", headers=auth)
        assert answer.status_code == 200, (name, answer.text)
        assert answer.content.startswith(PNG), name


def test_players_name_the_codecs_a_browser_is_asked_about(served) -> None:
    _, _, settings = served
    job = operations(settings.home).job("ops.clip")
    (player,) = JobFiles(open_store(settings.store_url, settings.s3)).players(job)
    preset = PRESETS["mobile"]
    assert player["name"] == "mobile" and preset.is_hevc
    level = round(float(preset.level) * 30)  # HEVC's level_idc: the level times 30
    assert player["type"] == f'video/mp4; codecs="hvc1.1.6.L{level}.B0, mp4a.40.2"'
    assert player["fallback"] == ""  # no H.264 rendition of this job to offer instead


def test_the_worst_seams_come_first_scored_by_the_gates_limits(served) -> None:
    _, _, settings = served
    job = operations(settings.home).job("ops.clip")
    limits = QcThresholds()

    def record(index: int, seam: dict) -> SegmentRecord:
        return SegmentRecord(index=index, attempt=1, seconds=1.0, seam=seam)

    seams = {
        1: {"jump": 2.0, "ssim_drop": 0.0, "delta_e": 0.0, "delta_l": 0.0, "passed": True},
        2: {"jump": 9.0, "ssim_drop": 0.0, "scene_change": True, "delta_e": 40.0,
            "passed": True},  # a new scene: the jump's limit is 3x, its colour not judged
        3: {"jump": 1.0, "ssim_drop": 0.0, "passed": False, "failures": ["SSIM drop"]},
    }  # fmt: skip
    view = JobView(job, {i: record(i, s) for i, s in seams.items()})
    worst = view.worst_seams(limits)
    assert [c["seam"] for c in worst] == [3, 2, 1]
    assert worst[1]["score"] == round(9.0 / (limits.seam_jump * 3), 3)
    assert worst[2]["score"] == round(2.0 / limits.seam_jump, 3)
    assert [c["failed"] for c in worst] == [True, False, False]
