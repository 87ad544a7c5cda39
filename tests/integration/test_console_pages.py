"""The console's pages and media against a hostile URL, and the video page in a real headless
Chromium (Debian's package, driven by Playwright): `factory serve` as its own process over a
video a real `factory run` delivered (tests/console_site.py starts it)."""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import sqlalchemy

from tests.conftest import embedded_env, run_cli
from tests.console_site import start_server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
MARKER = "Your session expired. Re-enter your token at https://evil.example/signin zq7x"
JOB = "pages.long"
FAILED_SEAM = 3  # recorded failing below, as a redo's join seam can be (it is judged, not made)
MANIFEST = (
    "batch: pages\ndefaults: {duration: 8, fps: 12, resolution: 160x96, "
    "segment: {frames: 16, overlap: 4}, renditions: [mobile, compat]}\n"
    "videos:\n  - {id: long, prompt: 'a lighthouse at night'}\n"
)


@dataclass
class Served:
    base: str
    home: Path
    tokens: dict[str, str]
    database_url: str

    def signed_in(self, role: str = "viewer") -> requests.Session:
        session = requests.Session()
        form = session.get(f"{self.base}/signin")
        secret = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)
        form = {"token": self.tokens[role], "csrf": secret, "next": "/"}
        done = session.post(f"{self.base}/signin", data=form, allow_redirects=False)
        assert done.status_code == 303, done.text
        return session

    def bearer(self) -> requests.Session:
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {self.tokens['viewer']}"
        return session


@pytest.fixture(scope="module")
def served(tmp_path_factory, pg_database_factory) -> Iterator[Served]:
    home = tmp_path_factory.mktemp("pages")
    database_url = pg_database_factory()
    env = {**embedded_env(home), "FACTORY_DATABASE_URL": database_url}
    assert run_cli("db", "upgrade", env=env).returncode == 0
    (home / "pages.yaml").write_text(MANIFEST)
    made = run_cli("run", str(home / "pages.yaml"), env=env, timeout=600)
    assert made.returncode == 0, made.stdout + made.stderr
    engine = sqlalchemy.create_engine(database_url)
    where = "WHERE job_id = :j AND segment = :s"
    with engine.begin() as conn:
        row = conn.execute(sqlalchemy.text(f"SELECT seam FROM job_segments {where}"),
                           {"j": JOB, "s": FAILED_SEAM}).one()  # fmt: skip
        seam = {**row.seam, "passed": False, "failures": ["jump 9.10 > 4"]}
        conn.execute(sqlalchemy.text(f"UPDATE job_segments SET seam = CAST(:seam AS json) {where}"),
                     {"seam": json.dumps(seam), "j": JOB, "s": FAILED_SEAM})  # fmt: skip
    engine.dispose()
    tokens = {}
    for role in ("viewer", "operator"):
        created = run_cli("token", "create", f"pages-{role}", "--role", role, env=env)
        assert created.returncode == 0, created.stderr
        tokens[role] = created.stdout.strip()
    base, process = start_server(env, home)
    yield Served(base, home, tokens, database_url)
    process.terminate()
    process.wait(10)


# --- no text from the URL in any page ------------------------------------------------------

PAGES = ("/", "/batches/pages", f"/jobs/{JOB}", "/signin")
HOSTILE = {"error": MARKER, "done": MARKER, "message": MARKER, "status_code": "500",
           "notice": MARKER, "flash": MARKER}  # fmt: skip


@pytest.mark.parametrize("path", PAGES)
def test_no_query_text_in_any_page(served: Served, path: str) -> None:
    session = served.signed_in("operator")
    plain = session.get(served.base + path)
    assert plain.status_code == 200
    for name, value in HOSTILE.items():
        answer = session.get(served.base + path, params={name: value, "done": "approve"})
        assert answer.status_code == plain.status_code, (name, answer.status_code)
        assert "zq7x" not in answer.text and "evil.example" not in answer.text, name
        assert 'class="notice"' not in answer.text and 'role="alert"' not in answer.text, name


@pytest.mark.parametrize("code", ["204", "304", "101", "0", "-1", "999", "500", "x"])
def test_the_status_code_is_the_server_s(served: Served, code: str) -> None:
    session = served.signed_in()
    answer = session.get(f"{served.base}/jobs/{JOB}", params={"status_code": code})
    assert answer.status_code == 200
    assert "<h1>long" in answer.text and answer.text.rstrip().endswith("</html>")


def test_an_unknown_job_or_batch_does_not_echo_its_name(served: Served) -> None:
    session = served.signed_in()
    named = MARKER.replace("/", " ")  # one path segment: it reaches the page routes
    for path in (f"/jobs/{named}", f"/batches/{named}", f"/batches/pages?after={named}"):
        answer = session.get(served.base + path)
        assert answer.status_code in (404, 422), path
        assert "zq7x" not in answer.text and "evil.example" not in answer.text


# --- media: Range and HEAD -----------------------------------------------------------------


@pytest.fixture(scope="module")
def media(served: Served) -> tuple[str, bytes]:
    url = f"{served.base}/media/{JOB}/compat.mp4"
    whole = served.bearer().get(url)
    assert whole.status_code == 200 and len(whole.content) > 1000
    return url, whole.content


def test_a_huge_range_is_not_a_server_error(served: Served, media: tuple[str, bytes]) -> None:
    url, whole = media
    for asked in ("bytes=0-" + "9" * 5000, "bytes=" + "1" * 5000 + "-", "bytes=-" + "7" * 5000,
                  "bytes=0-" + "9" * 20):  # fmt: skip
        answer = served.bearer().get(url, headers={"Range": asked})
        assert answer.status_code in (200, 416), (asked[:12], answer.status_code)
        if answer.status_code == 200:
            assert answer.content == whole
        else:
            assert answer.headers["Content-Range"] == f"bytes */{len(whole)}"


def test_a_malformed_range_is_ignored(served: Served, media: tuple[str, bytes]) -> None:
    url, whole = media
    for asked in ("bytes=-", "bytes=5-3", "bytes=a-b", "lines=0-5", "bytes=0-1,4-5", "bytes 0-5"):
        answer = served.bearer().get(url, headers={"Range": asked})
        assert answer.status_code == 200, asked
        assert answer.content == whole and "Content-Range" not in answer.headers


def test_an_unsatisfiable_range_is_416(served: Served, media: tuple[str, bytes]) -> None:
    url, whole = media
    for asked in (f"bytes={len(whole)}-", f"bytes={len(whole) + 10}-{len(whole) + 20}", "bytes=-0"):
        answer = served.bearer().get(url, headers={"Range": asked})
        assert answer.status_code == 416, asked
        assert answer.headers["Content-Range"] == f"bytes */{len(whole)}"


def test_a_range_is_206_with_its_bytes(served: Served, media: tuple[str, bytes]) -> None:
    url, whole = media
    size = len(whole)
    for asked, want in (("bytes=10-99", (10, 99)), ("bytes=100-", (100, size - 1)),
                        ("bytes=-50", (size - 50, size - 1)),
                        (f"bytes=0-{size + 5000}", (0, size - 1)),
                        ("BYTES=0-0", (0, 0))):  # fmt: skip
        answer = served.bearer().get(url, headers={"Range": asked})
        assert answer.status_code == 206, asked
        assert answer.content == whole[want[0] : want[1] + 1]
        assert answer.headers["Content-Range"] == f"bytes {want[0]}-{want[1]}/{size}"


def test_head_on_media(served: Served, media: tuple[str, bytes]) -> None:
    url, whole = media
    head = served.bearer().head(url)
    assert head.status_code == 200 and head.content == b""
    assert head.headers["Content-Length"] == str(len(whole))
    assert head.headers["Content-Type"] == "video/mp4" and head.headers["Accept-Ranges"] == "bytes"
    ranged = served.bearer().head(url, headers={"Range": "bytes=0-9"})
    assert ranged.status_code == 206 and ranged.content == b""
    assert ranged.headers["Content-Length"] == "10"
    for name in ("contact.png", "thumb.png", "seam-1.png"):
        got = served.bearer().get(f"{served.base}/media/{JOB}/{name}")
        head = served.bearer().head(f"{served.base}/media/{JOB}/{name}")
        assert (head.status_code, head.content) == (200, b""), name
        assert head.headers["Content-Length"] == str(len(got.content)), name
    assert served.bearer().head(f"{served.base}/media/{JOB}/nope.mp4").status_code == 404
    assert requests.head(url).status_code == 401


# --- the video page in a browser -----------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator:
    from playwright.sync_api import sync_playwright

    if CHROMIUM is None:
        pytest.fail("Debian's chromium package is not installed; scripts/test installs it")
    with sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture
def page(browser, served: Served) -> Iterator:
    context = browser.new_context(viewport={"width": 1280, "height": 860})  # the CSP applies
    opened = context.new_page()
    problems: list[str] = []
    opened.on("pageerror", lambda error: problems.append(str(error)))
    opened.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    opened.goto(f"{served.base}/jobs/{JOB}")
    opened.fill("input[name=token]", served.tokens["viewer"])
    opened.click("button[type=submit]")
    opened.wait_for_url(f"**/jobs/{JOB}")
    yield opened
    context.close()
    assert problems == [], problems  # no script error, nothing the CSP refused


def until(where, script: str, tries: int = 150) -> None:
    """Polled from here: the page's CSP (script-src 'self') refuses Playwright's in-page
    polling (it evaluates strings), and the test keeps that policy on."""
    for _ in range(tries):
        if where.evaluate(script):
            return
        time.sleep(0.1)
    raise AssertionError(f"never true: {script}")


def test_hevc_the_browser_cannot_play_gives_way_to_compat(page) -> None:
    codecs = page.locator("video.player[data-rendition=mobile]").get_attribute("data-type")
    assert codecs.startswith('video/mp4; codecs="hvc1.')
    if page.evaluate("t => document.createElement('video').canPlayType(t)", codecs):
        pytest.fail("this Chromium plays HEVC: the fallback cannot be seen here")
    mobile = page.locator("figure", has=page.locator("video[data-rendition=mobile]"))
    notice = mobile.locator(".cannot-play")
    notice.wait_for(state="visible")
    assert "cannot play" in notice.inner_text() and "compat" in notice.inner_text()
    player = mobile.locator("video.player")
    until(
        player, "v => v.currentSrc.endsWith('/compat.mp4') && v.readyState >= 1 && v.videoWidth > 0"
    )
    compat = page.locator("figure", has=page.locator("video[data-rendition=compat]"))
    assert compat.locator(".cannot-play").is_hidden()  # H.264 plays here: nothing to say
    assert compat.locator("video").evaluate("v => v.currentSrc").endswith("/compat.mp4")


def test_seams_are_a_grid_worst_first_and_seek(page) -> None:
    cells = page.locator(".seam-grid a.seam-cell")
    count = cells.count()
    assert count == 7
    scores = [float(cells.nth(i).get_attribute("data-score")) for i in range(count)]
    assert cells.nth(0).get_attribute("data-seam") == str(FAILED_SEAM)  # the failure first
    assert "failed" in cells.nth(0).get_attribute("class")
    assert "jump 9.10 > 4" in cells.nth(0).inner_text()
    assert [c for c in range(count) if "failed" in cells.nth(c).get_attribute("class")] == [0]
    assert scores[1:] == sorted(scores[1:], reverse=True)
    until(page, "() => [...document.querySelectorAll('.seam-grid img')].every(i => i.naturalWidth)")
    columns = page.evaluate(
        "getComputedStyle(document.querySelector('.seam-grid')).gridTemplateColumns.split(' ')"
    )
    assert len(columns) >= 3  # a grid, not one column
    grid_height = page.evaluate("document.querySelector('.seam-grid').offsetHeight")
    assert grid_height < 860
    assert page.locator("img[src$='/contact.png']").count() == 0  # the tall sheet: a link only
    assert page.locator("a[href$='/contact.png']").count() == 1
    second = cells.nth(1)
    wanted = float(second.get_attribute("data-seconds"))
    assert second.get_attribute("href")  # still a link
    second.click()
    for player in page.locator("video.player").all():
        landed = player.evaluate("v => v.currentTime")
        assert abs(landed - max(0.0, wanted - 0.5)) < 0.1
    assert f"/jobs/{JOB}" in page.url and "#" not in page.url


def test_a_flash_is_only_the_server_s_own(served: Served) -> None:
    """After an action the page says what was done, from a code the server signed for this
    session and this job; the same code in another session, or forged, shows nothing. (Last:
    the job is delivered again in the background.)"""
    operator = served.signed_in("operator")
    page = operator.get(f"{served.base}/jobs/{JOB}")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
    again = {"csrf": csrf, "from_stage": "deliver"}
    acted = operator.post(f"{served.base}/jobs/{JOB}/requeue", data=again, allow_redirects=False)
    assert acted.status_code == 303, acted.text
    target = acted.headers["location"]
    assert target.startswith(f"/jobs/{JOB}?done=requeue.")
    shown = operator.get(served.base + target)
    assert 'class="notice"' in shown.text and "Requeued" in shown.text
    other = served.signed_in("operator").get(served.base + target)  # another session
    assert 'class="notice"' not in other.text
    forged = target[:-1] + ("0" if target[-1] != "0" else "1")
    assert 'class="notice"' not in operator.get(served.base + forged).text
    for done in ("requeue", "approve", f"approve.{target.split('.')[-1]}"):
        answer = operator.get(f"{served.base}/jobs/{JOB}", params={"done": done})
        assert 'class="notice"' not in answer.text, done
    refused = operator.post(f"{served.base}/jobs/{JOB}/approve", data={"csrf": csrf})
    assert refused.status_code == 409 and 'role="alert"' in refused.text  # the server's words
