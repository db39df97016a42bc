"""Screenshot of the search page answering one query, for docs/images/ (headless Debian Chromium via selenium).

    .venv/bin/python tools/search_screenshot.py INDEX QUERY_IMAGE OUT.png [--k 8]

Serves INDEX on a free local port in this process, opens the page in headless Chromium, uploads QUERY_IMAGE, waits
for the top-K grid and saves the page as OUT.png. README ("Retrieval service", "On emoji") shows the commands
that built the index and the query.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from deepmetric.retrieval import Searcher
from deepmetric.retrieval.background import BackgroundServer
from deepmetric.retrieval.service import create_app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("index")
    parser.add_argument("query")
    parser.add_argument("out")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--size", default="1100,900", help="window width,height")
    args = parser.parse_args()
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 f"--window-size={args.size}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path="/usr/bin/chromedriver"),
                              options=options)
    try:
        with BackgroundServer(create_app(Searcher(args.index))) as server:
            driver.get(server.url + "/")
            wait = WebDriverWait(driver, 120)
            wait.until(lambda b: "images" in b.find_element(By.ID, "info").text)
            driver.find_element(By.ID, "k").clear()
            driver.find_element(By.ID, "k").send_keys(str(args.k))
            driver.find_element(By.ID, "file").send_keys(str(Path(args.query).resolve()))
            wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#results .result")) == args.k)
            wait.until(lambda b: b.execute_script(
                "return [...document.images].every(i => i.complete && i.naturalWidth > 0)"))
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(args.out)
    finally:
        driver.quit()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
