"""The documentation site (mkdocs.yml, docs/): it builds with ``mkdocs build --strict`` — a broken link or anchor, a
page missing from the navigation or an API reference that does not resolve fails the suite — and it works in a real
browser: headless Chromium (Debian's chromium + chromium-driver, via selenium) opens it from the disk, as the
README says, and from a server, searches it offline and opens a method's page.

mkdocs, mkdocs-material and mkdocstrings are dev dependencies (``make install-dev``); the browser test is skipped,
saying why, only where Chromium is missing, as tests/test_serve_browser.py is.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from browser_helpers import headless_chromium

pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[dev]')")
pytest.importorskip("material", reason="mkdocs-material is not installed (pip install -e '.[dev]')")
pytest.importorskip("mkdocstrings", reason="mkdocstrings is not installed (pip install -e '.[dev]')")

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
HANG_GUARD_S = 120  # only so that a broken page fails instead of hanging the suite; not a speed requirement
METHOD_PAGES = {"methods/diablo.md": "DIABLO", "methods/abe.md": "ABE", "methods/dgml.md": "DGML",
                "methods/deml.md": "DeML", "methods/horde.md": "HORDE", "methods/second-order.md": "Second-order",
                "methods/jcf.md": "JCF", "methods/mirage.md": "MIRAGE"}


def _nav_pages(nav) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    return [page for item in nav for page in _nav_pages(item)]


def _config() -> dict:
    class Loader(yaml.SafeLoader):  # mkdocs.yml names a Python function (the slugify); only read its keys here
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
    return yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)


# mkdocs run with torch, torchvision and deepmetric refused: the site is built from the Markdown and the sources'
# text (mkdocstrings reads the docstrings statically), so `make docs` installs only requirements-docs.txt
MKDOCS_WITHOUT_TORCH = """
import sys


class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("torch", "torchvision", "deepmetric"):
            raise ImportError(f"the documentation build imported {name}: it must need only requirements-docs.txt")
        return None


sys.meta_path.insert(0, Refuse())
from mkdocs.__main__ import cli

sys.argv[0] = "mkdocs"
cli()
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once for this module with ``mkdocs build --strict`` into a temporary folder, in a process
    that may not import torch nor deepmetric (as in `make docs`' own small environment)."""
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    command = [sys.executable, "-c", MKDOCS_WITHOUT_TORCH, "build", "--strict", "--site-dir", str(out)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    assert "WARNING" not in result.stderr, result.stderr
    return out


def test_the_site_builds_strictly_with_every_page(site):
    """Every Markdown page of docs/ (the study records' own files, docs/studies/<record>/, aside; the study pages
    docs/studies/*.md included) is in the navigation, and built; the method pages and the API reference have their
    content; the search index holds every page."""
    nav = _nav_pages(_config()["nav"])
    parts = [p.relative_to(DOCS).parts for p in DOCS.rglob("*.md")]
    pages = sorted("/".join(part) for part in parts if part[0] != "studies" or len(part) == 2)
    assert sorted(nav) == pages
    for page in pages:
        assert (site / page).with_suffix(".html").exists(), page
    for page, title in METHOD_PAGES.items():
        html = (site / page).with_suffix(".html").read_text(encoding="utf-8")
        assert re.search(rf"<h1[^>]*>{title}", html), page
        assert 'id="presets"' in html and 'id="in-python"' in html and "highlight" in html, page
    reference = (site / "reference.html").read_text(encoding="utf-8")
    for name in ("create_model", "retrieval_metrics", "load_dataset", "build_objective", "ISTA", "export_model"):
        assert re.search(rf'id="deepmetric\.[\w.]*{name}"', reference), name
    index = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))
    locations = {doc["location"].split("#")[0] for doc in index["docs"]}
    assert {str(Path(p).with_suffix(".html")) for p in pages} <= locations


def _requirements(lines) -> dict[str, str]:
    """{distribution name, lower case: the whole requirement} of requirement lines (comments and blanks dropped)."""
    found = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            found[re.match(r"[A-Za-z0-9_.-]+", line)[0].lower()] = line
    return found


def test_make_docs_installs_only_what_mkdocs_needs():
    """`make docs` builds the site in a small environment of its own from requirements-docs.txt: not the project's
    environment, whose torch is 6 GB (it ran `make install-dev`: torch, then every dev dependency). The dev extra
    holds the same requirements, so that the suite builds the site with what `make docs` installs."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    result = subprocess.run([make, "-n", "-B", "docs"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    recipe = result.stdout
    assert "mkdocs build --strict" in recipe, recipe
    assert "-r requirements-docs.txt" in recipe, recipe
    for heavy in ("torch", "-e .", "[dev]"):
        assert heavy not in recipe, (heavy, recipe)
    docs = _requirements((ROOT / "requirements-docs.txt").read_text(encoding="utf-8").splitlines())
    assert {"mkdocs-material", "mkdocstrings"} <= set(docs) and "[python]" in docs["mkdocstrings"], docs
    assert not {"torch", "torchvision", "deepmetric"} & set(docs), docs
    import tomllib

    dev = _requirements(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
                        ["project"]["optional-dependencies"]["dev"])
    assert {name: dev.get(name) for name in docs} == docs


def test_the_site_loads_nothing_from_the_network(site):
    """Built and read offline: no page asks for fonts, scripts or styles from another host."""
    for page in site.rglob("*.html"):
        html = page.read_text(encoding="utf-8")
        external = re.findall(r"<(?:script|link)[^>]+(?:src|href)=\"(https?:[^\"]+)\"", html)
        assert not external, (page.relative_to(site), external)


def test_links_to_the_repository_name_files_that_exist(site, tmp_path):
    """A page's link to a file outside docs/ (../src/..., ../benchmarks/...) becomes its repository path on the site
    (tools/mkdocs_hooks.py), and the strict build fails when that file does not exist (on a scratch project that
    uses the same hook, so that docs/ is never written to)."""
    cli = (site / "cli.html").read_text(encoding="utf-8")
    assert "config/sections.py" in cli and "../src/deepmetric" not in cli
    project = tmp_path / "project"
    (project / "docs").mkdir(parents=True)
    (project / "present.py").write_text("")
    hook = ROOT / "tools" / "mkdocs_hooks.py"
    (project / "mkdocs.yml").write_text(f"site_name: probe\nstrict: true\nhooks: [{hook}]\n")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")

    def build(page: str) -> subprocess.CompletedProcess:
        (project / "docs" / "index.md").write_text(page, encoding="utf-8")
        command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(project / "site")]
        return subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=600)

    good = build("# Probe\n\nSee [the code](../present.py).\n")
    assert good.returncode == 0, good.stderr
    assert "the code (<code>present.py</code> in the repository)" in (project / "site/index.html").read_text()
    bad = build("# Probe\n\nSee [the code](../no-such-file.py).\n")
    assert bad.returncode != 0 and "no-such-file.py" in bad.stderr


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def served(site):
    """The built site on http://127.0.0.1:<free port>/ (there Material's search fetches search_index.json)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(params=["file", "http"])
def home(request, site) -> str:
    """The home page's address, opened as the README says (``site/index.html`` from the disk, a file:// address:
    Material's search then reads its index from search/search_index.js, the offline plugin's copy, and runs its
    worker through the iframe-worker shim) and from a server (search/search_index.json)."""
    if request.param == "file":
        return (site / "index.html").as_uri()
    return request.getfixturevalue("served") + "/index.html"


@pytest.fixture
def browser():
    with headless_chromium("1280,900") as driver:
        yield driver


def test_searching_the_site_opens_a_method_page(home, browser, tmp_path):
    """Open the home page (from the disk, as the README says, and from a server), type a method's name in
    Material's search box (its index is searched in the browser, offline), follow the result to the method's page,
    check its heading, and keep a screenshot of it. From the disk the search box was hidden (issue 53: the search
    index could not load from file://)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, HANG_GUARD_S)
    browser.get(home)
    wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "article h1").text.strip() == "deepmetric")
    assert browser.title.startswith("deepmetric")
    box = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "input.md-search__input"))
    wait.until(lambda b: box.is_displayed())
    box.click()
    box.send_keys("DIABLO")
    results = "ol.md-search-result__list li a"
    wait.until(lambda b: any("methods/diablo.html" in (a.get_attribute("href") or "")
                             for a in b.find_elements(By.CSS_SELECTOR, results)))
    meta = browser.find_element(By.CSS_SELECTOR, ".md-search-result__meta").text
    assert "matching" in meta.lower() or "result" in meta.lower(), meta
    link = next(a for a in browser.find_elements(By.CSS_SELECTOR, results)
                if "methods/diablo.html" in (a.get_attribute("href") or ""))
    link.click()
    wait.until(lambda b: "methods/diablo.html" in b.current_url)
    heading = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "article h1")).text.strip()
    assert heading == "DIABLO: dictionary-based attention"
    assert browser.title.startswith("DIABLO")
    # the page's navigation reaches the other methods, and its code is highlighted
    nav = " ".join(a.get_attribute("textContent") for a in browser.find_elements(By.CSS_SELECTOR, "nav.md-nav a"))
    assert all(name in nav for name in ("ABE and M-heads", "DGML and grouping", "MIRAGE", "Python API reference"))
    assert browser.find_elements(By.CSS_SELECTOR, "div.highlight pre code")
    browser.find_element(By.CSS_SELECTOR, "body").send_keys(Keys.HOME)
    screenshot = tmp_path / f"docs-diablo-{home.split(':')[0]}.png"
    assert browser.save_screenshot(str(screenshot))
    data = screenshot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000
    if os.environ.get("DEEPMETRIC_SCREENSHOTS"):  # a folder to keep the screenshot in, to look at it
        Path(os.environ["DEEPMETRIC_SCREENSHOTS"]).mkdir(parents=True, exist_ok=True)
        shutil.copy(screenshot, Path(os.environ["DEEPMETRIC_SCREENSHOTS"]) / screenshot.name)
