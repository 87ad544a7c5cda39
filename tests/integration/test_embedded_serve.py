"""`factory serve` on the embedded defaults (SQLite and a folder store under FACTORY_HOME, no
broker, no sweeper, no workers): what its API accepts, its own in-process runner does."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.conftest import embedded_env
from tests.console_site import Site, serve_site, settled, stop_site
from tests.integration.test_console_api import signed_in

TINY = ("defaults: {duration: 2, fps: 12, resolution: 160x96, segment: {frames: 16, overlap: 4},"
        " renditions: [mobile]}\nvideos:\n  - {id: one, prompt: 'a forest at noon'}\n")  # fmt: skip


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Iterator[Site]:
    home = tmp_path_factory.mktemp("embedded")
    made = serve_site(embedded_env(home), home, "embedded", ("viewer", "operator"))
    yield made
    stop_site(made)


def test_submit_and_requeue_over_the_api_run_to_done(site: Site) -> None:
    api = site.api("operator")
    batch = f"emb-{uuid.uuid4().hex[:8]}"
    made = api.post(f"{site.base}/api/v1/manifests", data=f"batch: {batch}\n{TINY}",
                    headers={"Content-Type": "application/yaml"})  # fmt: skip
    assert made.status_code == 201, made.text
    job_id = f"{batch}.one"
    job = settled(site, job_id)
    assert job["stage"] == "done", job["last_error"]
    assert site.store_path(f"{batch}/one/out/mobile.mp4").stat().st_size > 0
    first = job["attempt"]

    again = api.post(f"{site.base}/api/v1/jobs/{job_id}/requeue", json={"from": "encode"})
    assert again.status_code == 200 and again.json()["stage"] == "encode", again.text
    job = settled(site, job_id)
    assert job["stage"] == "done", job["last_error"]
    assert job["attempt"] > first
    events = [
        e["event"] for e in api.get(f"{site.base}/api/v1/jobs/{job_id}/events").json()["items"]
    ]
    after = events[events.index("requeued") :]
    assert after.count("claimed") == 1 and after[-1] == "advanced", after

    # The console's form goes the same way.
    session, csrf = signed_in(site, "operator")
    form = {"csrf": csrf, "from_stage": "deliver"}
    sent = session.post(f"{site.base}/jobs/{job_id}/requeue", data=form, allow_redirects=False)
    assert sent.status_code == 303, sent.text
    job = settled(site, job_id)
    assert job["stage"] == "done" and job["attempt"] > first + 1, job


def test_an_approval_is_delivered_by_the_server_itself(site: Site) -> None:
    api = site.api("operator")
    batch = f"emb-{uuid.uuid4().hex[:8]}"
    made = api.post(f"{site.base}/api/v1/manifests",
                    data=f"batch: {batch}\nreview: required\n{TINY}")  # fmt: skip
    assert made.status_code == 201, made.text
    job_id = f"{batch}.one"
    assert settled(site, job_id)["stage"] == "review"
    approved = api.post(f"{site.base}/api/v1/jobs/{job_id}/approve", json={"note": "fine"})
    assert approved.status_code == 200, approved.text
    job = settled(site, job_id)
    assert job["stage"] == "done", job["last_error"]
    assert site.store_path(f"{batch}/one/out/mobile.mp4").stat().st_size > 0
