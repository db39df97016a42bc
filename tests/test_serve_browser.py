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
from deepmetric.retrieval.background import BackgroundServer
from deepmetric.retrieval.service import create_app
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
        names = [c.find_element(By.CSS_SELECTOR, ".name").get_attribute("title") for c in cells]
        files = [c.find_element(By.CSS_SELECTOR, ".name .file").get_attribute("textContent") for c in cells]
        status = browser.find_element(By.ID, "status").text
        screenshot = tmp_path / "search-page.png"
        assert browser.save_screenshot(str(screenshot))
    assert scores[0] == pytest.approx(1.0, abs=1e-3) and scores == sorted(scores, reverse=True)
    assert all(-1.0 <= s <= 1.0 for s in scores)
    assert ranks == [f"{r}." for r in range(1, K + 1)] and names[0] == query.name and f"{K} results" in status
    assert files == [name.split("/")[-1] for name in names]  # below a line of the folders, if any
    assert screenshot.stat().st_size > 10_000
    keep(screenshot)


def keep(screenshot: Path) -> None:
    if os.environ.get("DEEPMETRIC_SCREENSHOTS"):  # a folder to keep the screenshot in, to look at it
        Path(os.environ["DEEPMETRIC_SCREENSHOTS"]).mkdir(parents=True, exist_ok=True)
        shutil.copy(screenshot, Path(os.environ["DEEPMETRIC_SCREENSHOTS"]) / screenshot.name)


CLASS_FOLDERS = ["class-folder-kitten", "class-folder-lion", "class-folder-tiger", "class-folder-puma"]
FOLDERS = "a-long-parent-folder-of-the-gallery/another-long-folder-name"


def test_a_long_caption_keeps_its_class_folder_in_view(tiny_run, tmp_path, browser):
    """Issue 53 item 10: the page cut a long caption from its left, so that only the end of the file name showed
    and the class folder, what tells a hit's class, was hidden. Each hit's class folder is drawn in full inside its
    caption, clear of the ellipsis, with the whole path as the caption's title."""
    sources = sorted(make_gallery(tmp_path / "made", len(CLASS_FOLDERS)))
    for number, (source, folder) in enumerate(zip(sources, CLASS_FOLDERS, strict=True)):
        target = tmp_path / "gallery" / FOLDERS / folder / f"a-long-file-name-of-an-icon-{number:04d}{source.suffix}"
        target.parent.mkdir(parents=True)
        shutil.copy(source, target)
    assert main(["index", str(tiny_run), "--images", str(tmp_path / "gallery"), "--out", str(tmp_path / "index"),
                 "--quiet"]) == 0
    with BackgroundServer(create_app(Searcher(tmp_path / "index"))) as server:
        browser.get(server.url + "/")
        wait = WebDriverWait(browser, HANG_GUARD_S)
        wait.until(lambda b: f"{len(CLASS_FOLDERS)} images" in b.find_element(By.ID, "info").text)
        browser.find_element(By.ID, "file").send_keys(str(sources[0]))
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#results .result")) == len(CLASS_FOLDERS))
        captions = browser.execute_script("""
            const canvas = document.createElement("canvas").getContext("2d");
            return [...document.querySelectorAll("#results .result .name")].map((name) => {
              const folder = name.title.split("/").slice(-2)[0];
              const walk = document.createTreeWalker(name, NodeFilter.SHOW_TEXT);
              while (walk.nextNode() && !walk.currentNode.data.includes(folder)) {}
              const node = walk.currentNode, start = node.data.indexOf(folder);
              const range = document.createRange();
              range.setStart(node, start);
              range.setEnd(node, start + folder.length);
              const text = range.getBoundingClientRect(), line = node.parentElement;
              const box = line.getBoundingClientRect();
              canvas.font = getComputedStyle(line).font;
              const cut = line.scrollWidth > line.clientWidth;  // an ellipsis is drawn at the cut end
              return {title: name.title, folder, left: text.left, right: text.right, boxLeft: box.left,
                      boxRight: box.right, ellipsis: cut ? canvas.measureText("\u2026").width : 0,
                      rtl: getComputedStyle(line).direction === "rtl"};
            });""")
        assert browser.save_screenshot(str(tmp_path / "long-captions.png"))
    keep(tmp_path / "long-captions.png")
    assert sorted(c["title"] for c in captions) == sorted(
        f"{FOLDERS}/{folder}/a-long-file-name-of-an-icon-{n:04d}{source.suffix}"
        for n, (folder, source) in enumerate(zip(CLASS_FOLDERS, sources, strict=True)))
    for caption in captions:  # inside its line, and clear of the ellipsis at the line's cut end
        cut_left, cut_right = (caption["ellipsis"], 0) if caption["rtl"] else (0, caption["ellipsis"])
        assert caption["boxLeft"] + cut_left - 0.5 <= caption["left"], caption
        assert caption["right"] <= caption["boxRight"] - cut_right + 0.5, caption
