"""The HTTP API and the console's security, against `factory serve` as its own process on a
real PostgreSQL database holding batches that a real `factory run` made (tests/console_site.py),
and media from the S3 stand through the server's own mutual-TLS client."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import sqlalchemy
from PIL import Image

from tests.conftest import embedded_env, run_cli
from tests.console_site import MARKUP, Site, make_site, settled, start_server, stop_site
from tests.footage import tone

ACTIONS = ("requeue", "cancel", "approve", "reject")


@pytest.fixture(scope="module")
def site(tmp_path_factory, pg_database_factory) -> Iterator[Site]:
    made = make_site(tmp_path_factory.mktemp("console"), pg_database_factory())
    yield made
    stop_site(made)


def signed_in(site: Site, role: str, client: str | None = None) -> tuple[requests.Session, str]:
    """A browser-like session after the sign-in form; returns it and the page's CSRF secret."""
    session = requests.Session()
    if client:
        session.headers["X-Forwarded-For"] = client
    form = session.get(f"{site.base}/signin")
    secret = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)
    done = session.post(
        f"{site.base}/signin",
        data={"token": site.tokens[role], "csrf": secret, "next": "/"},
        allow_redirects=False,
    )
    assert done.status_code == 303, done.text
    page = session.get(f"{site.base}/")
    return session, re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)


def events_of(site: Site, job_id: str) -> list[dict]:
    answer = site.api("viewer").get(f"{site.base}/api/v1/jobs/{job_id}/events")
    return answer.json()["items"]


# --- nothing anonymous but /healthz ---------------------------------------------------------


def test_only_health_is_served_without_a_token(site: Site) -> None:
    anonymous = site.api(None)
    assert anonymous.get(f"{site.base}/healthz").json()["ok"] is True
    for path in ("/api/v1/jobs", "/api/v1/batches", "/api/v1/openapi.json",
                 "/api/v1/jobs/nightly.seen", "/media/nightly.seen/mobile.mp4",
                 "/media/nightly.seen/thumb.png"):  # fmt: skip
        answer = anonymous.get(site.base + path)
        assert answer.status_code == 401, path
        assert answer.headers["WWW-Authenticate"] == "Bearer"
    for path in ("/", "/batches/nightly", "/jobs/nightly.seen", "/batches/nightly/live"):
        answer = anonymous.get(site.base + path, allow_redirects=False)
        assert answer.status_code == 303 and answer.headers["location"].startswith("/signin")
    forged = site.api(None)
    forged.headers["Authorization"] = "Bearer fct_not-a-token"
    assert forged.get(f"{site.base}/api/v1/jobs").status_code == 401


def test_the_schema_lists_every_endpoint(site: Site) -> None:
    schema = site.api("viewer").get(f"{site.base}/api/v1/openapi.json").json()
    paths = set(schema["paths"])
    for action in ACTIONS:
        assert f"/api/v1/jobs/{{job_id}}/{action}" in paths
    assert {"/api/v1/batches", "/api/v1/jobs", "/api/v1/manifests", "/api/v1/tokens"} <= paths


# --- reading ------------------------------------------------------------------------------------


def test_batches_count_their_jobs_by_stage(site: Site) -> None:
    items = site.api("viewer").get(f"{site.base}/api/v1/batches").json()["items"]
    by_name = {b["batch"]: b for b in items}
    plain = by_name["plain"]
    assert (plain["jobs"], plain["delivered"], plain["review"]) == (2, 2, False)
    assert plain["frames_done"] == plain["frames_total"] == 2 * 24
    nightly = site.api("viewer").get(f"{site.base}/api/v1/batches/nightly").json()
    assert nightly["review"] is True and nightly["jobs"] == 5
    assert nightly["waiting_review"] + nightly["delivered"] + nightly["failed"] == 5
    assert site.api("viewer").get(f"{site.base}/api/v1/batches/nope").status_code == 404


def test_jobs_page_by_keyset_without_repeats_or_gaps(site: Site) -> None:
    viewer = site.api("viewer")
    everything = [j["job_id"] for j in viewer.get(f"{site.base}/api/v1/jobs").json()["items"]]
    assert len(everything) == 7
    seen, after = [], None
    while True:
        params = {"limit": 2} | ({"after": after} if after else {})
        page = viewer.get(f"{site.base}/api/v1/jobs", params=params).json()
        seen += [j["job_id"] for j in page["items"]]
        after = page["next"]
        if after is None:
            break
    assert seen == everything
    only = viewer.get(f"{site.base}/api/v1/jobs", params={"batch": "plain", "stage": "done"})
    assert [j["job_id"] for j in only.json()["items"]] == ["plain.one", "plain.two"]
    bad = viewer.get(f"{site.base}/api/v1/jobs", params={"after": "garbage!"})
    assert bad.status_code == 422 and bad.json()["field"] == "after"
    bad = viewer.get(f"{site.base}/api/v1/jobs", params={"stage": "baking"})
    assert bad.status_code == 422 and bad.json()["problems"][0]["field"] == "query.stage"


def test_a_job_in_full(site: Site) -> None:
    job = site.api("viewer").get(f"{site.base}/api/v1/jobs/plain.one").json()
    assert job["stage"] == "done" and set(job["outputs"]) >= {"mobile", "qc", "contact"}
    assert {"generate", "encode", "mux", "qc", "deliver"} <= set(job["timings"])
    assert [s["seam"] for s in job["seams"]] == [1]
    assert {"jump", "seconds", "ssim_drop", "passed"} <= set(job["seams"][0])
    checks = {c["name"]: c for c in job["checks"]["mobile"]}
    assert checks["frames_decoded"] == {"name": "frames_decoded", "passed": True,
                                        "value": 24, "limit": 24}  # fmt: skip
    assert "vmaf" in checks and checks["vmaf"]["limit"] > 0
    assert job["qc"]["passed"] is True and len(job["segments_made"]) == 2
    events = [e["event"] for e in events_of(site, "plain.one")]
    assert events[0] == "submitted" and events[-1] == "advanced"
    missing = site.api("viewer").get(f"{site.base}/api/v1/jobs/plain.nope")
    assert missing.status_code == 404 and missing.json()["field"] == "job"


# --- submitting --------------------------------------------------------------------------------


def test_submit_yaml_and_json_with_the_cli_s_messages(site: Site, tmp_path: Path) -> None:
    operator = site.api("operator")
    batch = f"api-{uuid.uuid4().hex[:8]}"
    text = (f"batch: {batch}\ndefaults: {{duration: 2, resolution: 160x96}}\n"
            "videos:\n  - {id: a, prompt: 'a harbor'}\n")  # fmt: skip
    made = operator.post(f"{site.base}/api/v1/manifests", data=text,
                         headers={"Content-Type": "application/yaml"})  # fmt: skip
    assert made.status_code == 201, made.text
    assert [(j["job_id"], j["created"]) for j in made.json()["jobs"]] == [(f"{batch}.a", True)]
    again = operator.post(f"{site.base}/api/v1/manifests", data=text)
    assert again.status_code == 200 and again.json()["created"] == 0
    as_json = {"batch": batch + "-j", "defaults": {"resolution": "160x96", "fps": 12},
               "videos": [{"id": "b", "prompt": "x", "duration": 2}]}  # fmt: skip
    made = operator.post(f"{site.base}/api/v1/manifests", json=as_json)
    assert made.status_code == 201 and made.json()["jobs"][0]["job_id"] == f"{batch}-j.b"
    submitted = events_of(site, f"{batch}.a")[0]
    assert submitted["event"] == "submitted"
    assert submitted["detail"]["actor"] == "token:test-operator"

    bad = ("batch: bad\nvideos:\n  - {id: a, prompt: x, duration: -3}\n"
           "  - {id: b, prompt: y, fps: 1000}\n")  # fmt: skip
    answer = operator.post(f"{site.base}/api/v1/manifests", data=bad)
    assert answer.status_code == 422
    problems = answer.json()["problems"]
    (tmp_path / "bad.yaml").write_text(bad)
    cli = run_cli("validate", str(tmp_path / "bad.yaml"), env=site.env)
    assert cli.returncode == 2
    for problem in problems:  # the same fields and words as the CLI's
        assert f"{problem['field']}: {problem['message']}" in cli.stderr
    assert {p["field"] for p in problems} == {"videos[0].duration", "videos[1].fps"}
    local = (
        "batch: loc\nvideos:\n  - {id: a, prompt: x, duration: 2, audio: {asset: ./README.md}}\n"
    )
    answer = operator.post(f"{site.base}/api/v1/manifests", data=local)
    assert answer.status_code == 422 and "videos[0].audio.asset" in answer.text
    assert "factory store put" in answer.text  # nothing beside the server is read
    assert site.api("viewer").get(f"{site.base}/api/v1/jobs?batch=loc").json()["items"] == []
    for job_id in (f"{batch}.a", f"{batch}-j.b"):  # the server runs them; no test needs them
        operator.post(f"{site.base}/api/v1/jobs/{job_id}/cancel", json={})


def test_hostile_material_in_the_store_is_refused_over_the_api(site: Site, tmp_path: Path) -> None:
    """Issue 49 over the API: a DASH manifest stored as a bed, an HLS playlist as a camera
    move and an animated picture, each named by its store key, are refused (422) naming the
    field, and the file the manifest and the playlist name is never read."""
    from tests.integration.test_hostile_media import Canary, dash_manifest, hls_playlist

    secret = tmp_path / "elsewhere" / "secret.wav"
    secret.parent.mkdir()
    tone(secret)
    canary = Canary(secret)
    for key, write in (("hostile/poly.g722", dash_manifest), ("hostile/move.mp4", hls_playlist)):
        site.store_path(key).parent.mkdir(parents=True, exist_ok=True)
        write(site.store_path(key), secret)
    frames = [Image.new("RGB", (32, 32), (40 * i, 0, 0)) for i in range(3)]
    frames[0].save(site.store_path("hostile/still.webp"), "WEBP", save_all=True,
                   append_images=frames[1:])  # fmt: skip
    text = ("batch: hostile\ndefaults: {duration: 4, resolution: 160x96}\nvideos:\n"
            "  - id: a\n    audio: {asset: hostile/poly.g722}\n"
            "    scenes:\n      - {start: 0, prompt: x, image: {asset: hostile/still.webp}}\n"
            "      - {start: 2, prompt: y, join: cut,"
            " camera: {asset: hostile/move.mp4}}\n")  # fmt: skip
    answer = site.api("operator").post(f"{site.base}/api/v1/manifests", data=text,
                                       headers={"Content-Type": "application/yaml"})  # fmt: skip
    assert answer.status_code == 422, answer.text
    said = {p["field"]: p["message"] for p in answer.json()["problems"]}
    assert len(said) == 3, answer.text
    assert said["videos[0].audio.asset"].startswith("hostile/poly.g722 is not a sound file")
    assert said["videos[0].scenes[1].camera.asset"].startswith(
        "hostile/move.mp4 is not a video file"
    )
    assert said["videos[0].scenes[0].image.asset"] == (
        "hostile/still.webp is animated (3 frames); a picture here is a still"
    )
    assert str(secret) not in answer.text
    assert canary.untouched(), "the server read what the hostile files name"
    assert site.api("viewer").get(f"{site.base}/api/v1/jobs?batch=hostile").json()["items"] == []


# --- acting, with roles ------------------------------------------------------------------------


def test_a_viewer_cannot_act_anywhere(site: Site) -> None:
    viewer = site.api("viewer")
    before = len(events_of(site, "nightly.seen"))
    for action in ACTIONS:
        answer = viewer.post(f"{site.base}/api/v1/jobs/nightly.seen/{action}",
                             json={"reason": "because"})  # fmt: skip
        assert answer.status_code == 403, action
        assert "test-viewer is a viewer; this needs operator" in answer.json()["error"]
    assert viewer.post(f"{site.base}/api/v1/manifests", data="batch: x").status_code == 403
    assert viewer.get(f"{site.base}/api/v1/tokens").status_code == 403
    assert site.api("operator").get(f"{site.base}/api/v1/tokens").status_code == 403
    session, csrf = signed_in(site, "viewer")
    for action in ACTIONS:
        answer = session.post(
            f"{site.base}/jobs/nightly.seen/{action}",
            data={"csrf": csrf, "reason": "x"},
            allow_redirects=False,
        )
        assert answer.status_code == 403, action
    assert len(events_of(site, "nightly.seen")) == before
    assert site.api("viewer").get(f"{site.base}/api/v1/jobs/nightly.seen").json()["stage"] == (
        "review"
    )


def test_approve_delivers_and_reject_records_why_with_the_actor(site: Site) -> None:
    operator = site.api("operator")
    assert not site.store_path("nightly/api-ok/out/mobile.mp4").exists()  # not published yet
    done = operator.post(f"{site.base}/api/v1/jobs/nightly.api-ok/approve", json={"note": "ok"})
    assert done.status_code == 200 and done.json()["stage"] == "deliver", done.text
    assert settled(site, "nightly.api-ok")["stage"] == "done"  # delivered by the server itself
    assert site.store_path("nightly/api-ok/out/mobile.mp4").stat().st_size > 0
    approved = [e for e in events_of(site, "nightly.api-ok") if e["event"] == "approved"]
    assert approved[0]["detail"] == {"from": "review", "actor": "token:test-operator",
                                     "note": "ok"}  # fmt: skip
    twice = operator.post(f"{site.base}/api/v1/jobs/nightly.api-ok/approve")
    assert twice.status_code == 409 and "not waiting for review" in twice.json()["error"]

    empty = operator.post(f"{site.base}/api/v1/jobs/nightly.api-no/reject", json={"reason": ""})
    assert empty.status_code == 422 and empty.json()["problems"][0]["field"] == "reason"
    sent = operator.post(f"{site.base}/api/v1/jobs/nightly.api-no/reject",
                         json={"reason": "the gulls melt at 0:03"})  # fmt: skip
    assert sent.json()["stage"] == "failed" and sent.json()["stopped_stage"] == "review"
    status = site.cli("status", "nightly.api-no")
    assert "rejected by token:test-operator" in status.stdout
    assert "the gulls melt at 0:03" in status.stdout
    assert "requeue nightly.api-no --from generate" in status.stdout
    assert not site.store_path("nightly/api-no/out/mobile.mp4").exists()
    # Sent back, it can be requeued: plain requeue puts it up for review again.
    again = operator.post(f"{site.base}/api/v1/jobs/nightly.api-no/requeue", json={})
    assert again.json()["stage"] == "review"
    requeued = [e for e in events_of(site, "nightly.api-no") if e["event"] == "requeued"]
    assert requeued[-1]["detail"]["actor"] == "token:test-operator"
    bad = operator.post(f"{site.base}/api/v1/jobs/nightly.api-no/requeue", json={"from": "bake"})
    assert bad.status_code == 422


def test_cancel_and_requeue_from_a_stage(site: Site) -> None:
    operator = site.api("operator")
    redo = operator.post(f"{site.base}/api/v1/jobs/plain.two/requeue", json={"from": "deliver"})
    assert redo.json()["stage"] == "deliver", redo.text
    assert settled(site, "plain.two")["stage"] == "done"  # run by the server itself (embedded)
    stopped = operator.post(f"{site.base}/api/v1/jobs/nightly.web-no/cancel",
                            json={"reason": "test"})  # fmt: skip
    assert stopped.json()["stage"] == "cancelled"
    last = events_of(site, "nightly.web-no")[-1]
    assert last["event"] == "cancelled" and last["detail"]["actor"] == "token:test-operator"
    twice = operator.post(f"{site.base}/api/v1/jobs/nightly.web-no/cancel", json={})
    assert twice.status_code == 409
    done = operator.post(f"{site.base}/api/v1/jobs/plain.two/cancel", json={})
    assert done.status_code == 409 and "already done" in done.json()["error"]


# --- the console's forms ---------------------------------------------------------------------


def test_no_form_post_without_its_csrf_secret_succeeds(site: Site) -> None:
    session, csrf = signed_in(site, "admin")
    before = len(events_of(site, "nightly.seen"))
    for action in ACTIONS:
        for sent in ({}, {"csrf": "forged"}, {"csrf": csrf[:-1] + "x"}):
            answer = session.post(f"{site.base}/jobs/nightly.seen/{action}",
                                  data={**sent, "reason": "x"}, allow_redirects=False)  # fmt: skip
            assert answer.status_code == 403, (action, sent)
    assert session.post(f"{site.base}/signout", allow_redirects=False).status_code == 403
    assert len(events_of(site, "nightly.seen")) == before
    # The sign-in form carries its own secret (no cookie, no sign-in).
    fresh = requests.post(f"{site.base}/signin", data={"token": site.tokens["admin"]},
                          allow_redirects=False)  # fmt: skip
    assert fresh.status_code == 403 and "factory_session" not in fresh.headers.get("set-cookie", "")
    # With it, a form does act; the API's Bearer calls need none (no cookie is involved).
    done = session.post(
        f"{site.base}/jobs/plain.one/requeue",
        data={"csrf": csrf, "from_stage": "deliver"},
        allow_redirects=False,
    )
    assert done.status_code == 303
    requeued = [e for e in events_of(site, "plain.one") if e["event"] == "requeued"]
    assert requeued[-1]["detail"]["actor"] == "token:test-admin"
    assert settled(site, "plain.one")["stage"] == "done"


def test_the_session_cookie_is_httponly_and_samesite(site: Site) -> None:
    session = requests.Session()
    form = session.get(f"{site.base}/signin")
    secret = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)
    answer = session.post(f"{site.base}/signin", allow_redirects=False,
                          data={"token": site.tokens["viewer"], "csrf": secret})  # fmt: skip
    cookie = answer.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=lax" in cookie
    assert "secure" not in cookie  # plain http on loopback; behind TLS: Secure (test below)
    outside = session.post(f"{site.base}/signin", allow_redirects=False,
                           data={"token": site.tokens["viewer"], "csrf": secret,
                                 "next": "//evil.example/x"})  # fmt: skip
    assert outside.status_code in (303, 403)
    assert not outside.headers.get("location", "/").startswith("//")


def test_behind_tls_the_cookie_is_secure(site: Site) -> None:
    session = requests.Session()
    session.headers["X-Forwarded-Proto"] = "https"  # the gateway (a trusted proxy) says so
    form = session.get(f"{site.base}/signin")
    secret = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)
    assert "secure" in form.headers["set-cookie"].lower()
    session.cookies.set("factory_signin", secret)
    answer = session.post(f"{site.base}/signin", allow_redirects=False,
                          data={"token": site.tokens["viewer"], "csrf": secret})  # fmt: skip
    assert "secure" in answer.headers["set-cookie"].lower()


def test_markup_in_prompts_renders_as_text(site: Site) -> None:
    session, _ = signed_in(site, "viewer")
    for path in ("/batches/nightly", "/jobs/nightly.seen"):
        page = session.get(site.base + path).text
        assert "&lt;script&gt;window.__xss = 1&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in page
        assert MARKUP not in page and "<b>bold</b>" not in page
    assert "script-src 'self'" in session.get(f"{site.base}/").headers["content-security-policy"]


# --- media --------------------------------------------------------------------------------------


def test_media_is_served_with_ranges(site: Site) -> None:
    viewer = site.api("viewer")
    whole = site.store_path("nightly/api-ok/out/mobile.mp4").read_bytes()
    url = f"{site.base}/media/nightly.api-ok/mobile.mp4"
    full = viewer.get(url)
    assert full.status_code == 200 and full.content == whole
    assert full.headers["accept-ranges"] == "bytes" and full.headers["content-type"] == "video/mp4"
    part = viewer.get(url, headers={"Range": "bytes=100-1099"})
    assert part.status_code == 206 and part.content == whole[100:1100]
    assert part.headers["content-range"] == f"bytes 100-1099/{len(whole)}"
    tail = viewer.get(url, headers={"Range": "bytes=-64"})
    assert tail.content == whole[-64:]
    past = viewer.get(url, headers={"Range": f"bytes={len(whole)}-"})
    assert past.status_code == 416 and past.headers["content-range"] == f"bytes */{len(whole)}"
    # A job in review plays what is being reviewed (its checked, muxed file).
    assert viewer.get(f"{site.base}/media/nightly.seen/compat.mp4").status_code == 200
    for picture in ("contact.png", "quality.png", "thumb.png"):
        answer = viewer.get(f"{site.base}/media/nightly.seen/{picture}")
        assert answer.status_code == 200 and answer.content[:4] == b"\x89PNG", picture


@pytest.mark.parametrize(
    "path",
    [
        "/media/nightly.seen/..%2F..%2F..%2Fetc%2Fpasswd",
        "/media/nightly.seen/%2e%2e%2fapi-ok%2fout%2fmobile.mp4",
        "/media/nightly.seen/qc.json",
        "/media/nightly.seen/master.mp4",  # not one of this video's renditions
        "/media/nightly.seen/segments%2F00000-a1.mkv",
        "/media/nightly.seen/out%2Fmobile.mp4",
        "/media/plain.one/compat.mp4",  # plain has no compat rendition
        "/media/..%2Fetc/passwd",
        "/media/nightly.nope/mobile.mp4",
        "/media/nightly.seen/mobile.mp4%00.png",
    ],
)
def test_media_urls_never_reach_outside_the_job_s_keys(site: Site, path: str) -> None:
    answer = site.api("viewer").get(site.base + path)
    assert answer.status_code == 404, (path, answer.status_code)
    assert b"root:" not in answer.content


def test_media_from_s3_through_the_server_s_mutual_tls_client(
    tmp_path: Path, pg_url: str, s3_stand, bucket: str
) -> None:
    env = {**embedded_env(tmp_path), "FACTORY_DATABASE_URL": pg_url,
           **s3_stand.env(f"s3://{bucket}/factory")}  # fmt: skip
    assert run_cli("db", "upgrade", env=env).returncode == 0
    (tmp_path / "m.yaml").write_text(
        "batch: s3 \ndefaults: {duration: 2, fps: 12, resolution: 160x96, "
        "segment: {frames: 16, overlap: 4}, renditions: [mobile]}\n"
        "videos:\n  - {id: one, prompt: 'a harbor'}\n".replace("s3 ", "s3media")
    )
    made = run_cli("run", str(tmp_path / "m.yaml"), env=env, timeout=600)
    assert made.returncode == 0, made.stdout + made.stderr
    token = run_cli("token", "create", "s3-viewer", "--role", "viewer", env=env).stdout.strip()
    base, process = start_server(env, tmp_path)
    try:
        whole = (
            s3_stand.direct_client()
            .get_object(Bucket=bucket, Key="factory/s3media/one/out/mobile.mp4")["Body"]
            .read()
        )
        headers = {"Authorization": f"Bearer {token}", "Range": "bytes=10-4009"}
        part = requests.get(f"{base}/media/s3media.one/mobile.mp4", headers=headers)
        assert part.status_code == 206 and part.content == whole[10:4010]
        thumb = requests.get(f"{base}/media/s3media.one/thumb.png", headers=headers)
        assert thumb.status_code == 200 and thumb.content[:4] == b"\x89PNG"
    finally:
        process.terminate()
        process.wait(10)


# --- tokens --------------------------------------------------------------------------------------


def test_a_revoked_token_is_refused_at_once(site: Site) -> None:
    created = site.cli("token", "create", "short-lived", "--role", "operator")
    secret = created.stdout.strip()
    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {secret}"
    assert api.get(f"{site.base}/api/v1/jobs").status_code == 200
    site.tokens["short-lived"] = secret
    session, _ = signed_in(site, "short-lived")
    assert session.get(f"{site.base}/", allow_redirects=False).status_code == 200
    assert site.cli("token", "revoke", "short-lived").returncode == 0
    assert api.get(f"{site.base}/api/v1/jobs").status_code == 401
    assert session.get(f"{site.base}/", allow_redirects=False).status_code == 303
    listed = json.loads(site.cli("token", "list", "--json").stdout)
    row = next(t for t in listed if t["name"] == "short-lived")
    assert row["revoked_at"] and row["last_used_at"]


def test_an_admin_manages_tokens_and_secrets_are_kept_hashed(site: Site) -> None:
    admin = site.api("admin")
    made = admin.post(f"{site.base}/api/v1/tokens", json={"name": "ci-bot", "role": "viewer"})
    assert made.status_code == 201 and made.json()["token"].startswith("fct_")
    secret = made.json()["token"]
    dup = admin.post(f"{site.base}/api/v1/tokens", json={"name": "ci-bot", "role": "viewer"})
    assert dup.status_code == 422 and dup.json()["field"] == "name"
    assert "token" not in admin.get(f"{site.base}/api/v1/tokens").json()["items"][0]
    gone = admin.delete(f"{site.base}/api/v1/tokens/ci-bot")
    assert gone.json()["revoked_at"]
    revoked = {"Authorization": f"Bearer {secret}"}
    assert requests.get(f"{site.base}/api/v1/jobs", headers=revoked).status_code == 401

    engine = sqlalchemy.create_engine(site.env["FACTORY_DATABASE_URL"])
    with engine.connect() as conn:
        stored = [
            r[0] for r in conn.execute(sqlalchemy.text("SELECT token_sha256 FROM api_tokens"))
        ]
    engine.dispose()
    assert secret not in stored and all(len(s) == 64 for s in stored)


def test_brute_force_sign_in_is_slowed(site: Site) -> None:
    client = "10.20.30.40"  # as the trusted gateway reports it (X-Forwarded-For)
    session = requests.Session()
    session.headers["X-Forwarded-For"] = client
    statuses = []
    for attempt in range(8):
        form = session.get(f"{site.base}/signin")
        secret = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)
        answer = session.post(f"{site.base}/signin", allow_redirects=False,
                              data={"token": f"fct_guess-{attempt}", "csrf": secret})  # fmt: skip
        statuses.append(answer.status_code)
    assert statuses[:5] == [401] * 5 and set(statuses[5:]) == {429}
    assert int(answer.headers["retry-after"]) > 0
    # While it waits, the right token still signs in (a flood cannot lock a user out); other
    # addresses are not affected.
    form = session.get(f"{site.base}/signin")
    secret = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)
    right = session.post(f"{site.base}/signin", allow_redirects=False,
                         data={"token": site.tokens["viewer"], "csrf": secret})  # fmt: skip
    assert right.status_code == 303
    signed_in(site, "viewer", client="10.20.30.41")
    guesses = requests.Session()
    guesses.headers["X-Forwarded-For"] = "10.20.30.42"
    codes = [guesses.get(f"{site.base}/api/v1/jobs",
                         headers={"Authorization": f"Bearer fct_g{i}"}).status_code
             for i in range(7)]  # fmt: skip
    assert codes[:5] == [401] * 5 and codes[5:] == [429, 429]


def test_a_batch_page_hears_of_changes_live(site: Site) -> None:
    """The grid's stream: every card at first, then each change within a read or two."""
    session, _ = signed_in(site, "viewer")
    stream = session.get(f"{site.base}/batches/plain/live", stream=True, timeout=30)
    assert stream.headers["content-type"].startswith("text/event-stream")
    lines = stream.iter_lines(decode_unicode=True)

    def next_event() -> dict:
        for line in lines:
            if line.startswith("data: "):
                return json.loads(line[len("data: ") :])
        raise AssertionError("the stream ended")

    first = {c["job_id"]: c for c in next_event()["jobs"]}
    assert set(first) == {"plain.one", "plain.two"}
    site.api("operator").post(f"{site.base}/api/v1/jobs/plain.one/requeue",
                              json={"from": "deliver"})  # fmt: skip
    changed = {c["job_id"]: c for c in next_event()["jobs"]}
    assert changed["plain.one"]["stage"] in ("deliver", "done") and "plain.two" not in changed
    while changed["plain.one"]["stage"] != "done":  # the server runs it (embedded)
        changed = {c["job_id"]: c for c in next_event()["jobs"]}
        assert "plain.two" not in changed
    stream.close()


def test_redo_over_the_api_delivers_a_new_version(site: Site) -> None:
    viewer, operator = site.api("viewer"), site.api("operator")
    if viewer.get(f"{site.base}/api/v1/jobs/nightly.api-ok").json()["stage"] == "review":
        operator.post(f"{site.base}/api/v1/jobs/nightly.api-ok/approve")  # run on its own
    assert settled(site, "nightly.api-ok")["stage"] == "done"
    body = {"range": "1-2", "reason": "a wave freezes"}
    refused = viewer.post(f"{site.base}/api/v1/jobs/nightly.api-ok/redo", json=body)
    assert refused.status_code == 403
    plan = operator.post(f"{site.base}/api/v1/jobs/nightly.api-ok/redo",
                         json=body | {"dry_run": True}).json()["plan"]  # fmt: skip
    assert plan["version"] == 2 and plan["segments"] and plan["join"] is not None
    bad = operator.post(f"{site.base}/api/v1/jobs/nightly.api-ok/redo", json={"range": "3-1"})
    assert bad.status_code == 422 and bad.json()["field"] == "--range"
    # A join change on a video of one shot, with a range, or past the body's limits: refused.
    for joins, extra in ((["1=cut"], {}), (["1=cut"], {"range": "1-2"}), (["1=" + "a" * 99], {})):
        bad = operator.post(f"{site.base}/api/v1/jobs/nightly.api-ok/redo",
                            json={"joins": joins, "dry_run": True, **extra})  # fmt: skip
        assert bad.status_code == 422, bad.text
        assert len(joins[0]) > 64 or bad.json()["field"] == "--join", bad.text
    # A swapped picture over the API: never a file of the server's (a path is refused unread),
    # a store key that is not there, a scene out of range, or past the body's limits.
    for images, field in ((["0=./../../etc/passwd"], "--image 0"), (["0=assets/none.png"],
                          "--image 0"), (["9=assets/none.png"], "--image"),
                          (["0=" + "a" * 1300], None), (["0=none"] * 51, None)):  # fmt: skip
        bad = operator.post(f"{site.base}/api/v1/jobs/nightly.api-ok/redo",
                            json={"images": images, "dry_run": True})  # fmt: skip
        assert bad.status_code == 422, bad.text
        assert field is None or bad.json()["field"] == field, bad.text
    started = operator.post(f"{site.base}/api/v1/jobs/nightly.api-ok/redo", json=body)
    assert started.status_code == 202, started.text
    again = operator.post(f"{site.base}/api/v1/jobs/nightly.api-ok/redo", json=body)
    assert again.status_code == 409  # one redo at a time
    deadline = time.monotonic() + 120
    while (job := viewer.get(f"{site.base}/api/v1/jobs/nightly.api-ok").json())["stage"] not in (
        "done",
        "review",
    ):
        assert time.monotonic() < deadline and job["stage"] != "failed", job["last_error"]
        time.sleep(0.5)
    # The batch requires review: the new version waits for it like the first one did.
    assert job["stage"] == "review" and job["version"] == 1
    assert not site.store_path("nightly/api-ok/v2/out/mobile.mp4").exists()
    seen = job["review_candidate"]
    assert seen == {"attempt": job["attempt"], "version": 2}
    approve = f"{site.base}/api/v1/jobs/nightly.api-ok/approve"
    # A decision on what the reviewer saw before (an earlier attempt) is refused, with why.
    stale = operator.post(approve, json={"attempt": seen["attempt"] - 1, "version": 2})
    assert stale.status_code == 409 and "changed since it was reviewed" in stale.text
    assert operator.post(approve, json=seen).status_code == 200
    job = settled(site, "nightly.api-ok")
    assert job["stage"] == "done"
    assert job["version"] == 2 and [v["version"] for v in job["versions"]] == [1, 2]
    assert site.store_path("nightly/api-ok/v2/out/mobile.mp4").exists()
    assert site.store_path("nightly/api-ok/out/mobile.mp4").exists()  # version 1 kept
    planned = [e for e in events_of(site, "nightly.api-ok") if e["event"] == "redo.planned"]
    assert planned[0]["detail"]["actor"] == "token:test-operator"
    assert viewer.get(f"{site.base}/media/nightly.api-ok/mobile.mp4").content == (
        site.store_path("nightly/api-ok/v2/out/mobile.mp4").read_bytes()
    )
