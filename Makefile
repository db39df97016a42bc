# deepmetric: two commands on a fresh machine.
#   make demo   set up, build the emoji data set (npm), train the default model, print Recall@K vs the untrained backbone
#   make demo-glyphs   the same on the offline glyphs toy set
#   make test   set up with the dev dependencies, check style (ruff), layers (lint-imports) and types (mypy), run the
#               test suite
#   make test-fast   the inner loop: style, layers and the suite without the slow files (the site build, the
#               browser, the wheel, the real backbone), stopping at the first failure
#   make docs   build the documentation site (docs/, mkdocs.yml) into site/, offline, in a small environment of its
#               own (.venv-docs: mkdocs and its plug-ins from requirements-docs.txt, no torch)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DOCS_VENV := .venv-docs
PIP := $(BIN)/python -m pip
# torch/torchvision as this project's machines install them from local files (keep pyproject's ranges in step)
TORCH := torch==2.14.1 torchvision==0.29.1
# Debian packages: the glyphs fonts (about 150 fonts covering the 175 characters), Fashion-MNIST, librsvg and Chromium
FONT_PACKAGES := fonts-dejavu-core fonts-dejavu-extra fonts-liberation fonts-liberation2 fonts-freefont-ttf \
	fonts-urw-base35 fonts-noto-core fonts-crosextra-carlito fonts-crosextra-caladea fonts-cantarell \
	fonts-open-sans fonts-lato
DATA_PACKAGES := dataset-fashion-mnist
# the icons data set draws the themes' SVG icons with librsvg's rsvg-convert (its .deb files come from apt-get itself)
ICON_PACKAGES := librsvg2-bin
# the emoji data set's packages are fetched with npm's own client (make demo)
DEMO_PACKAGES := npm
# the browser test of the search page (tests/test_serve_browser.py) drives headless Chromium through chromedriver
BROWSER_PACKAGES := chromium chromium-driver
DEMO_RUN ?= runs/demo

.PHONY: demo demo-glyphs test test-fast install install-dev system-packages demo-packages lint docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(PIP) install --quiet --no-compile $(TORCH)
	$(PIP) install --quiet --no-compile -e .
	touch $@

# make test starts python about 170 times (the CLI, the wheel, torchrun) and, with nothing byte-compiled (--no-compile
# here, PYTHONDONTWRITEBYTECODE on this project's machines), each start compiles torch and timm again: compiling the
# environment once, on every core, takes half a minute and saves 2 to 8 minutes of make test (docs/testing.md).
# make demo starts python once and keeps --no-compile's faster install. The compile is only a speed-up, so a file it
# cannot compile (torch ships one in a newer Python's syntax, never imported here) does not stop make test.
$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP) install --quiet --no-compile -e '.[dev]'
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib > /dev/null 2>&1 || true
	touch $@

install: $(VENV)/.installed

install-dev: $(VENV)/.installed-dev

# Installs the Debian packages when this is a Debian machine and we may (root); otherwise says what is missing.
system-packages:
	@missing=$$(for p in $(FONT_PACKAGES) $(DATA_PACKAGES) $(ICON_PACKAGES) $(BROWSER_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || echo $$p; done); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		echo "installing Debian packages: $$missing"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null) \
		|| echo "warning: apt-get failed; glyphs falls back to matplotlib's fonts, the Fashion-MNIST, icons and browser tests are skipped"; \
	else \
		echo "note: not installing $$missing (needs apt-get as root); glyphs falls back to matplotlib's fonts"; \
	fi

# npm for the emoji packages, when it is missing and we may install it (Debian, root)
demo-packages:
	@command -v npm >/dev/null && exit 0; \
	if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		echo "installing Debian packages: $(DEMO_PACKAGES)"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(DEMO_PACKAGES) >/dev/null) \
		|| echo "warning: apt-get failed; the emoji loader will say how to give it the packages without npm"; \
	else \
		echo "note: npm is missing (needs apt-get as root to install it); the emoji loader will say what to do"; \
	fi

demo: install demo-packages
	rm -rf $(DEMO_RUN)
	$(BIN)/deepmetric train --config configs/demo-emoji.yaml --out $(DEMO_RUN)

demo-glyphs: install system-packages
	rm -rf $(DEMO_RUN)-glyphs
	$(BIN)/deepmetric train --config configs/demo-glyphs.yaml --out $(DEMO_RUN)-glyphs

# the suite in two processes (pytest-xdist): 29 % less time on 2 cores of an AMD EPYC of family 23 (docs/testing.md);
# make test PYTEST_WORKERS=0 runs it in one process
PYTEST_WORKERS ?= 2
test: install-dev system-packages
	$(BIN)/ruff check src tests benchmarks tools
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --durations=15

# what a change is checked with before make test: failures first (--ff), the first one stops it
FAST_SKIP := tests/test_docs_site.py tests/test_serve_browser.py tests/test_packaged_presets.py tests/test_cuda.py
test-fast: install-dev
	$(BIN)/ruff check src tests benchmarks tools
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python -m pytest -x --ff -m "not integration" $(addprefix --ignore=,$(FAST_SKIP))

lint: install-dev
	$(BIN)/ruff check src tests benchmarks tools

# mkdocs only: the site needs neither torch nor deepmetric (mkdocstrings reads the sources' docstrings as text)
$(DOCS_VENV)/.installed: requirements-docs.txt
	$(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(DOCS_VENV)/bin/python -m pip install --quiet --no-compile -r requirements-docs.txt
	touch $@

# --strict: a broken link or anchor, a page left out of the navigation or an unresolved API reference fails the build
docs: $(DOCS_VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict --site-dir site
	@echo "documentation: site/index.html"

clean:
	rm -rf $(VENV) $(DOCS_VENV) runs build site *.egg-info src/*.egg-info .pytest_cache .ruff_cache
