"""The documentation's examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.mark.integration
def test_readme_python_examples_run(capsys):
    """Every ```python block of README.md, executed in order in one namespace (the real offline backbone)."""
    blocks = python_blocks(README.read_text())
    assert blocks, "README.md has no python example"
    namespace: dict = {}
    for number, block in enumerate(blocks, start=1):
        exec(compile(block, f"README.md python block {number}", "exec"), namespace)
    printed = capsys.readouterr().out
    assert "'recall@1'" in printed and "'map@r'" in printed  # evaluate() printed its metrics
