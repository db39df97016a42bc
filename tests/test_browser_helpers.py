"""The browser tests' skip (issue 53 item 26): with Chromium installed but not chromium-driver, ``pytest`` alone
stopped at collection, since ``test_serve_browser.py`` calls the skip at module level, which pytest refuses without
``allow_module_level=True``; the whole suite then ran nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_a_missing_chromium_driver_skips_the_browser_module_instead_of_stopping_the_collection(tmp_path):
    pytest_module = tmp_path / "test_needs_a_browser.py"
    pytest_module.write_text(
        "import sys\nfrom pathlib import Path\n\nimport browser_helpers\n\n"
        "browser_helpers.CHROMIUM = Path(sys.executable)  # a file that exists: Chromium is there\n"
        "browser_helpers.CHROMEDRIVER = Path('/nonexistent/chromedriver')  # its driver is not\n"
        "browser_helpers.skip_without_chromium()\n\n\ndef test_in_the_browser():\n    raise AssertionError\n\n\n"
        "def test_elsewhere():\n    pass\n")
    (tmp_path / "test_other.py").write_text("def test_other():\n    pass\n")
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(tmp_path)],
                            capture_output=True, text=True, cwd=tmp_path, env={"PYTHONPATH": str(TESTS), "PATH": ""},
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed, 1 skipped" in result.stdout and "chromium-driver" in result.stdout, result.stdout
