"""The search page in a real browser: headless Chromium (Debian's chromium + chromium-driver) via selenium.

`make test` installs both Debian packages (the Makefile's system-packages target); the test is skipped,
saying why, only where they are missing.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from browser_helpers import headless_chromium, skip_without_chromium
from deepmetric.cli import main
from deepmetric.retrieval import Searcher
from deepmetric.retrieval.service import BackgroundServer, create_app
from serve_helpers import make_gallery

skip_without_chromium()

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

K = 4
HANG_GUARD_S = 300  # only so that a broken page fails instead of hanging the suite; not a speed requirement


@pytest.fixture
def browser():
    with headless_chromium("1200,800") as driver:
        yield driver


def test_upload_on_the_page_shows_the_top_k_grid(tiny_run, tmp_path, browser):
    files = sorted(make_gallery(tmp_path / "gallery", 8))
    assert main(["index", str(tiny_run), "--images", str(tmp_path / "gallery"), "--out", str(tmp_path / "index"),
                 "--quiet"]) == 0
    app = create_app(Searcher(tmp_path / "index"))
    query = files[3]
    with BackgroundServer(app) as server:
        browser.get(server.url + "/")
        wait = WebDriverWait(browser, HANG_GUARD_S)
        wait.until(lambda b: "8 images" in b.find_element(By.ID, "info").text)
        browser.find_element(By.ID, "k").clear()
        browser.find_element(By.ID, "k").send_keys(str(K))
        browser.find_element(By.ID, "file").send_keys(str(query))
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#results .result")) == K)
        wait.until(lambda b: b.execute_script(
            "return [...document.querySelectorAll('#results img')].every(i => i.complete && i.naturalWidth > 0)"))
        cells = browser.find_elements(By.CSS_SELECTOR, "#results .result")
        scores = [float(c.find_element(By.CSS_SELECTOR, ".score").text) for c in cells]
        ranks = [c.find_element(By.CSS_SELECTOR, ".rank").text for c in cells]
        names = [c.find_element(By.CSS_SELECTOR, ".name").text.strip("\u200e") for c in cells]
        status = browser.find_element(By.ID, "status").text
        screenshot = tmp_path / "search-page.png"
        assert browser.save_screenshot(str(screenshot))
    assert scores[0] == pytest.approx(1.0, abs=1e-3) and scores == sorted(scores, reverse=True)
    assert all(-1.0 <= s <= 1.0 for s in scores)
    assert ranks == [f"{r}." for r in range(1, K + 1)] and names[0] == query.name and f"{K} results" in status
    assert screenshot.stat().st_size > 10_000
    if os.environ.get("DEEPMETRIC_SCREENSHOTS"):  # a folder to keep the screenshot in, to look at it
        Path(os.environ["DEEPMETRIC_SCREENSHOTS"]).mkdir(parents=True, exist_ok=True)
        shutil.copy(screenshot, Path(os.environ["DEEPMETRIC_SCREENSHOTS"]) / screenshot.name)
