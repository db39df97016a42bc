"""Headless Chromium for the browser tests (Debian's chromium + chromium-driver, through selenium)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


def skip_without_chromium():
    """selenium's webdriver module, or a skip saying what is missing (`make test` installs both); called inside a
    test or at a test module's top (``allow_module_level``: without it pytest stopped the whole collection)."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[dev]')")
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.exists()]
    if missing:
        pytest.skip(f"Chromium is not installed ({', '.join(missing)} missing: apt-get install chromium "
                    "chromium-driver, or make system-packages)", allow_module_level=True)
    return webdriver


@contextlib.contextmanager
def headless_chromium(window: str) -> Iterator:
    """A headless Chromium driver with a ``window`` ("1280,900") viewport, quit on exit."""
    webdriver = skip_without_chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", f"--window-size={window}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
