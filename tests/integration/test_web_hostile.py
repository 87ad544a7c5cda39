"""The console and API against a hostile network (issue 33, part A), on a real `factory serve`
process (embedded: SQLite and a folder store under FACTORY_HOME, default settings, so loopback
is an untrusted client): another site in a signed-in browser, an anonymous client sending
bodies, a failed-token flood with forged forwarded addresses, a revoked token's open stream,
a forged Host header."""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from factory.config.console import parse as parse_console_settings
from factory.errors import ConfigError
from factory.web.auth import WINDOW_SECONDS, SignInLimiter
from factory.web.guard import MAX_STREAMS
from tests.conftest import embedded_env
from tests.console_site import Site, serve_site, stop_site

EVIL = "https://evil.example"
MiB = 1 << 20


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Iterator[Site]:
    home = tmp_path_factory.mktemp("hostile")
    made = serve_site(embedded_env(home), home, "hostile")
    yield made
    stop_site(made)


def sign_in(site: Site, token: str) -> tuple[requests.Session, str]:
    """A browser after the sign-in form: its session cookie and the pages' CSRF secret."""
    browser = requests.Session()
    form = browser.get(f"{site.base}/signin")
    secret = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)
    done = browser.post(f"{site.base}/signin", allow_redirects=False,
                        data={"token": token, "csrf": secret, "next": "/"})  # fmt: skip
    assert done.status_code == 303, done.text
    page = browser.get(f"{site.base}/")
    return browser, re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)


def new_token(site: Site, role: str) -> tuple[str, str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    made = site.api("admin").post(f"{site.base}/api/v1/tokens", json={"name": name, "role": role})
    assert made.status_code == 201, made.text
    return name, made.json()["token"]


# --- 1. another site in the operator's browser ------------------------------------------------

# Every state-changing API route, as a plain HTML form on another site would send it.
WRITES = (
    ("POST", "/api/v1/jobs/nightly.one/approve", '{"note": "x"}'),
    ("POST", "/api/v1/jobs/nightly.one/reject", '{"reason": "x"}'),
    ("POST", "/api/v1/jobs/nightly.one/cancel", '{"reason": "x"}'),
    ("POST", "/api/v1/jobs/nightly.one/requeue", "{}"),
    ("POST", "/api/v1/jobs/nightly.one/redo", '{"range": "0-1"}'),
    ("POST", "/api/v1/manifests", "batch: evil\nvideos: [{id: a, prompt: b}]\n"),
    ("POST", "/api/v1/tokens", '{"name": "evil", "role": "admin"}'),
    ("DELETE", "/api/v1/tokens/hostile-viewer", ""),
)


@pytest.mark.parametrize(
    "extra",
    [
        {"Origin": EVIL},  # another site
        {"Origin": EVIL, "Sec-Fetch-Site": "cross-site"},
        {"Origin": "https://sibling.example", "Sec-Fetch-Site": "same-site"},  # a sibling host
        {},  # no Origin at all: the API still takes no cookie
    ],
    ids=["origin", "cross-site", "same-site", "no-origin"],
)
def test_a_cookie_only_write_to_the_api_is_refused(site: Site, extra: dict[str, str]) -> None:
    browser, _ = sign_in(site, site.tokens["admin"])
    for method, path, body in WRITES:
        answer = browser.request(method, site.base + path, data=body, allow_redirects=False,
                                 headers={"Content-Type": "text/plain", **extra})  # fmt: skip
        assert answer.status_code in (401, 403), (method, path, answer.status_code, answer.text)
    names = [t["name"] for t in site.api("admin").get(f"{site.base}/api/v1/tokens").json()["items"]]
    assert "evil" not in names
    assert site.api("viewer").get(f"{site.base}/api/v1/jobs").status_code == 200  # not revoked
    # The same calls with the token reach the routes (404: no such job; 422: a bad manifest).
    answer = site.api("operator").post(f"{site.base}/api/v1/jobs/nightly.one/approve", json={})
    assert answer.status_code == 404, answer.text


def test_a_console_form_posted_from_another_site_is_refused(site: Site) -> None:
    browser, csrf = sign_in(site, site.tokens["operator"])
    form = {"csrf": csrf, "reason": "x"}
    for extra in ({"Origin": EVIL}, {"Sec-Fetch-Site": "cross-site"},
                  {"Sec-Fetch-Site": "same-site"}, {"Origin": "null"}):  # fmt: skip
        answer = browser.post(f"{site.base}/jobs/nightly.one/cancel", data=form, headers=extra,
                              allow_redirects=False)  # fmt: skip
        assert answer.status_code == 403, (extra, answer.status_code)
        signout = browser.post(f"{site.base}/signout", data={"csrf": csrf}, headers=extra,
                               allow_redirects=False)  # fmt: skip
        assert signout.status_code == 403, extra
    # From the console's own origin (what a browser sends for its own form) it goes through.
    host = site.base.removeprefix("http://")
    for own in ({"Origin": site.base}, {"Sec-Fetch-Site": "same-origin", "Origin": site.base},
                {"Host": host}):  # fmt: skip
        answer = browser.post(f"{site.base}/jobs/nightly.one/cancel", data=form, headers=own,
                              allow_redirects=False)  # fmt: skip
        assert answer.status_code == 404, (own, answer.status_code)  # no such job: it got there
    # A sign-in posted from another site (login CSRF) is refused as well.
    assert requests.post(f"{site.base}/signin", headers={"Origin": EVIL},
                         data={"token": "x", "csrf": "y"}).status_code == 403  # fmt: skip


# --- 2. nothing read before authentication --------------------------------------------------


def peak_rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1))


def test_an_anonymous_40_mib_body_is_refused_without_being_read(site: Site) -> None:
    pid = site.process.pid
    before = peak_rss_kib(pid)
    big = b'{"name": "' + b"a" * (40 * MiB) + b'", "role": "admin"}'
    anonymous = requests.post(f"{site.base}/api/v1/tokens", data=big,
                              headers={"Content-Type": "application/json"})  # fmt: skip
    assert anonymous.status_code == 401, anonymous.text
    assert "problems" not in anonymous.text and "name" not in anonymous.text  # no schema

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it streams
        yield b'{"name": "'
        for _ in range(40):
            yield b"a" * MiB
        yield b'"}'

    chunked = requests.post(f"{site.base}/api/v1/manifests", data=chunks(),
                            headers={"Content-Type": "application/json"})  # fmt: skip
    assert chunked.status_code == 401
    # Token holders get a cap too: by Content-Length, and by count when it streams.
    admin = site.api("admin")
    assert admin.post(f"{site.base}/api/v1/tokens", data=big,
                      headers={"Content-Type": "application/json"}).status_code == 413  # fmt: skip
    assert admin.post(f"{site.base}/api/v1/manifests", data=chunks()).status_code == 413
    assert admin.post(f"{site.base}/api/v1/tokens", data=b" " * (65 * 1024),
                      headers={"Content-Type": "application/json"}).status_code == 413  # fmt: skip
    # A manifest may be up to 1 MiB: read (and found wanting: 422 naming the field).
    manifest = b"batch: big\n# " + b"x" * (900 * 1024) + b"\nvideos: []\n"
    answer = admin.post(f"{site.base}/api/v1/manifests", data=manifest)
    assert answer.status_code == 422, answer.text
    grown = peak_rss_kib(pid) - before
    print(f"peak RSS of factory serve: {before} KiB before, up {grown} KiB")
    assert grown < 64 * 1024, f"peak RSS up {grown} KiB"
    assert requests.get(f"{site.base}/healthz").status_code == 200


def test_empty_and_missing_bodies_reach_their_route(site: Site) -> None:
    operator = site.api("operator")
    for data in (None, b""):  # no body at all, Content-Length: 0
        answer = operator.post(f"{site.base}/api/v1/jobs/none/approve", data=data, timeout=30)
        assert answer.status_code == 404, (data, answer.text)
    answer = operator.post(f"{site.base}/api/v1/jobs/none/approve", json={}, timeout=30)
    assert answer.status_code == 404, answer.text
    answer = operator.get(f"{site.base}/api/v1/jobs", data=b"x", timeout=30)
    assert answer.status_code == 200


def test_an_anonymous_caller_learns_nothing_of_the_schema(site: Site) -> None:
    for method, path, _ in WRITES:
        answer = requests.request(method, site.base + path, data="{not json",
                                  headers={"Content-Type": "application/json"})  # fmt: skip
        assert answer.status_code == 401, (path, answer.status_code)
        assert answer.headers["WWW-Authenticate"] == "Bearer"
        assert "problems" not in answer.text


# --- 3. the failed-token limiter ------------------------------------------------------------


def test_forged_forwarded_addresses_do_not_escape_the_limiter(site: Site) -> None:
    """Loopback is not a trusted proxy by default: its X-Forwarded-For is ignored, so rotating
    it changes nothing; the address's valid tokens keep working all along."""
    codes = []
    for i in range(12):
        forged = {"Authorization": f"Bearer fct_guess{i}", "X-Forwarded-For": f"198.51.100.{i}"}
        answer = requests.get(f"{site.base}/api/v1/jobs", headers=forged)
        codes.append(answer.status_code)
    assert codes[:5] == [401] * 5 and set(codes[5:]) == {429}, codes
    assert int(answer.headers["Retry-After"]) > 0
    # A valid token from the same (limited) address answers 200, over the API and at sign-in.
    assert site.api("viewer").get(f"{site.base}/api/v1/jobs").status_code == 200
    victim = site.api("operator")
    victim.headers["X-Forwarded-For"] = "198.51.100.77"
    assert victim.get(f"{site.base}/api/v1/batches").status_code == 200
    sign_in(site, site.tokens["viewer"])
    # A wrong one at sign-in still waits.
    browser = requests.Session()
    form = browser.get(f"{site.base}/signin")
    secret = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)
    answer = browser.post(f"{site.base}/signin", allow_redirects=False,
                          data={"token": "fct_wrong", "csrf": secret})  # fmt: skip
    assert answer.status_code == 429


def test_limiter_entries_expire_by_age() -> None:
    now = [1000.0]
    limiter = SignInLimiter(3, clock=lambda: now[0])
    for i in range(5000):
        limiter.failed(f"203.0.113.{i % 250}.{i}")
    limiter.failed("192.0.2.1")
    limiter.failed("192.0.2.1")
    limiter.failed("192.0.2.1")
    assert limiter.wait("192.0.2.1") > 0 and len(limiter) == 5001
    now[0] += WINDOW_SECONDS + 1
    limiter.failed("192.0.2.2")  # any use prunes what is older than the window
    assert len(limiter) == 1 and limiter.wait("192.0.2.1") == 0
    # IPv6 clients are counted by their /64: rotating the host part gains nothing.
    for i in range(3):
        limiter.failed(f"2001:db8::{i + 1}")
    assert limiter.wait("2001:db8::ffff") > 0 and limiter.wait("2001:db8:0:1::1") == 0


def test_forwarded_headers_are_trusted_only_from_listed_proxies() -> None:
    assert parse_console_settings({}).trusted_proxies == ""  # nobody, loopback included
    listed = parse_console_settings({"FACTORY_CONSOLE_TRUSTED_PROXIES": "10.0.0.2, 10.1.0.0/16"})
    assert listed.trusted_proxies == "10.0.0.2,10.1.0.0/16"
    for bad in ("*", "gateway", "10.0.0.300"):
        with pytest.raises(ConfigError):
            parse_console_settings({"FACTORY_CONSOLE_TRUSTED_PROXIES": bad})


# --- 6. live streams end when their token is revoked ----------------------------------------


def test_a_live_stream_ends_within_10_s_of_revocation(site: Site) -> None:
    name, secret = new_token(site, "viewer")
    browser, _ = sign_in(site, secret)
    stream = browser.get(f"{site.base}/batches/anything/live", stream=True, timeout=(5, 40))
    assert stream.status_code == 200
    lines = stream.iter_lines(decode_unicode=True)
    assert next(lines).startswith("retry:")
    ended = threading.Event()

    def drain() -> None:
        try:
            for _ in lines:
                pass
        except requests.RequestException:
            pass
        ended.set()

    threading.Thread(target=drain, daemon=True).start()
    assert not ended.wait(1.0)  # open while the token is valid
    revoked = site.api("admin").delete(f"{site.base}/api/v1/tokens/{name}")
    assert revoked.status_code == 200
    assert ended.wait(10.0), "the stream still runs 10 s after its token was revoked"
    stream.close()


def test_open_streams_per_session_are_capped(site: Site) -> None:
    browser, _ = sign_in(site, site.tokens["viewer"])
    url = f"{site.base}/batches/anything/live"
    opened = [browser.get(url, stream=True, timeout=(5, 40)) for _ in range(MAX_STREAMS)]
    try:
        assert [s.status_code for s in opened] == [200] * MAX_STREAMS
        over = browser.get(url, stream=True, timeout=(5, 40))
        assert over.status_code == 429
        over.close()
        other, _ = sign_in(site, site.tokens["viewer"])  # another session has its own
        mine = other.get(url, stream=True, timeout=(5, 40))
        assert mine.status_code == 200
        mine.close()
    finally:
        for s in opened:
            s.close()
    deadline = time.monotonic() + 30  # a closed stream frees its place
    while (again := browser.get(url, stream=True, timeout=(5, 40))).status_code != 200:
        again.close()
        assert time.monotonic() < deadline, "closed streams were never released"
        time.sleep(0.5)
    again.close()


# --- 7. Host, caching and security headers --------------------------------------------------


def test_the_host_header_never_reaches_a_location(site: Site) -> None:
    browser, _ = sign_in(site, site.tokens["viewer"])
    for who in (requests.Session(), site.api("viewer"), browser):
        for path in ("/api/v1/jobs/", "/api/v1/batches/", "/batches/x/", "/signin/", "/",
                     "/jobs/x/", "/static", "/static/", "/media/x/a/", "/healthz/"):  # fmt: skip
            answer = who.get(site.base + path, headers={"Host": "evil.example"},
                             allow_redirects=False)  # fmt: skip
            location = answer.headers.get("location", "")
            assert "evil.example" not in location, (path, answer.status_code, location)


def test_api_answers_are_never_cached(site: Site) -> None:
    admin = site.api("admin")
    made = admin.post(f"{site.base}/api/v1/tokens",
                      json={"name": f"c-{uuid.uuid4().hex[:8]}", "role": "viewer"})  # fmt: skip
    assert made.status_code == 201 and made.json()["token"]
    answers = [made, admin.get(f"{site.base}/api/v1/jobs"),
               admin.get(f"{site.base}/api/v1/jobs/none"),
               requests.get(f"{site.base}/api/v1/tokens"),
               admin.post(f"{site.base}/api/v1/tokens", json={"name": "?"})]  # fmt: skip
    for answer in answers:
        assert answer.headers.get("Cache-Control") == "no-store", (answer.url, answer.status_code)


def test_every_page_carries_the_security_headers(site: Site) -> None:
    browser, _ = sign_in(site, site.tokens["viewer"])
    answers = [requests.get(f"{site.base}/signin"), browser.get(f"{site.base}/"),
               browser.get(f"{site.base}/jobs/none"), requests.get(f"{site.base}/api/v1/jobs"),
               requests.post(f"{site.base}/api/v1/tokens", data=b"x" * (70 * 1024)),
               browser.get(f"{site.base}/batches/none")]  # fmt: skip
    for answer in answers:
        headers = answer.headers
        assert headers["X-Content-Type-Options"] == "nosniff", answer.url
        assert headers["Referrer-Policy"] in ("same-origin", "no-referrer"), answer.url
        assert "frame-ancestors 'none'" in headers["Content-Security-Policy"], answer.url
        assert "script-src 'self'" in headers["Content-Security-Policy"], answer.url
        assert headers.get("Cache-Control") == "no-store", answer.url
