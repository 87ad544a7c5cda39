"""The console in a real headless Chromium (Debian's package, driven by Playwright; no browser
is downloaded) on batches a real `factory run` made: sign in, play a rendition, click a seam,
approve one video and send another back. The screenshots in docs/ are taken here
(FACTORY_SCREENSHOTS=docs/images writes them there)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.console_site import MARKUP, Site, make_site, settled, stop_site

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def site(tmp_path_factory, pg_database_factory) -> Iterator[Site]:
    made = make_site(tmp_path_factory.mktemp("browser"), pg_database_factory())
    yield made
    stop_site(made)


@pytest.fixture(scope="module")
def browser() -> Iterator:
    from playwright.sync_api import sync_playwright

    if CHROMIUM is None:  # a missing browser fails the tests: they are not optional
        pytest.fail("Debian's chromium package is not installed; scripts/test installs it")
    with sync_playwright() as driver:
        launched = driver.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--autoplay-policy=no-user-gesture-required"],
        )
        yield launched
        launched.close()


@pytest.fixture
def page(browser, site: Site) -> Iterator:
    # CSP off for the test driver's own scripts: a prompt that was not escaped would then run
    # (window.__xss), so escaping is what keeps it text, not the policy.
    context = browser.new_context(viewport={"width": 1280, "height": 860}, bypass_csp=True)
    opened = context.new_page()
    problems: list[str] = []
    opened.on("pageerror", lambda error: problems.append(str(error)))
    yield opened
    context.close()
    assert problems == [], problems  # no script error on any page


def sign_in(page, site: Site, role: str, target: str) -> None:
    page.goto(site.base + target)
    assert "/signin" in page.url  # sent to sign in first, and back afterwards
    page.fill("input[name=token]", site.tokens[role])
    page.click("button[type=submit]")
    page.wait_for_url(f"**{target}")


def screenshot(page, name: str, tmp_path: Path) -> None:
    folder = os.environ.get("FACTORY_SCREENSHOTS")
    target = Path(folder) if folder else tmp_path
    target.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(target / f"{name}.png"), full_page=False)


def test_sign_in_watch_the_batch_play_and_seek(page, site: Site, tmp_path: Path) -> None:
    sign_in(page, site, "viewer", "/batches/nightly")
    cards = page.locator(".card")
    assert cards.count() == 5
    seen = page.locator("#card-nightly\\.seen")
    assert MARKUP in seen.locator(".prompt").inner_text()  # shown as text, not run
    assert page.evaluate("window.__xss") is None
    page.wait_for_function("document.body.getAttribute('data-live-updates') !== null")
    assert seen.locator("[data-field=stage]").inner_text() == "review"
    page.wait_for_function(
        "[...document.querySelectorAll('.card img')].every(i => i.complete && i.naturalWidth)"
    )
    screenshot(page, "console-batch", tmp_path)
    page.goto(site.base + "/")
    assert page.locator("table.batches").inner_text().count("nightly") >= 1
    screenshot(page, "console-batches", tmp_path)

    page.goto(site.base + "/jobs/nightly.seen")
    player = page.locator("video.player").first
    player.evaluate("v => { v.muted = true; return v.play(); }")
    page.wait_for_function(
        "document.querySelector('video.player').currentTime > 0.5", timeout=15000
    )
    played = player.evaluate("v => v.currentTime")
    assert played > 0.5
    player.evaluate("v => v.pause()")
    seams = page.locator("button.seam")
    assert seams.count() == 3
    seams.nth(1).click()
    wanted = float(seams.nth(1).get_attribute("data-seconds"))
    landed = player.evaluate("v => v.currentTime")
    assert abs(landed - (wanted - 0.5)) < 0.1  # half a second before the seam
    assert page.locator("#seam-scores").inner_text().startswith("Seam 2 at")
    # A viewer sees no actions.
    assert page.locator("section.actions").count() == 0
    screenshot(page, "console-video", tmp_path)


def test_approve_one_and_send_one_back(page, site: Site, tmp_path: Path) -> None:
    sign_in(page, site, "operator", "/jobs/nightly.web-ok")
    assert not site.store_path("nightly/web-ok/out/mobile.mp4").exists()
    screenshot(page, "console-review", tmp_path)
    page.click("button.approve")
    page.wait_for_url("**/jobs/nightly.web-ok?done=approve.*")
    assert settled(site, "nightly.web-ok")["stage"] == "done"  # the server delivers it (embedded)
    page.reload()
    assert page.locator("#stage").inner_text() == "done"
    assert site.store_path("nightly/web-ok/out/mobile.mp4").stat().st_size > 0
    assert "approved" in page.locator("section.events").inner_text()

    page.goto(site.base + "/jobs/nightly.web-no")
    page.fill("form[action$='/reject'] input[name=reason]", "the boat doubles at 0:02")
    page.click("button.reject")
    page.wait_for_url("**/jobs/nightly.web-no?done=reject.*")
    assert page.locator("#stage").inner_text() == "failed (in review)"
    status = site.cli("status", "nightly.web-no")
    assert "rejected by token:test-operator" in status.stdout
    assert "the boat doubles at 0:02" in status.stdout
    assert not site.store_path("nightly/web-no/out/mobile.mp4").exists()
