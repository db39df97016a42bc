"""The type checker that `make test` runs (mypy, configured in pyproject.toml) catches a wrong argument type in the
public API, as a user's own type checker does with the types deepmetric ships (``py.typed``).

mypy runs in a subprocess on a small file of calls, with the project's configuration, from the repository root (its
cache there is the one `make test`'s own mypy run leaves, so this takes seconds after it; a minute or two cold).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("mypy", reason="mypy is not installed (the dev extra installs it)")

CALLS = '''\
from pathlib import Path

import numpy as np

import deepmetric
from deepmetric.evaluation import retrieval_metrics

run = deepmetric.load_run(Path("runs/cub"), checkpoint="best", device="cpu")
wrong_run = deepmetric.load_run("runs/cub", checkpoint=3)
model = deepmetric.create_model(backbone="tiny", embedding_dim=16, pretrained=False)
wrong_model = deepmetric.create_model(embedding_dim="512")
figures = retrieval_metrics(run.embed(["a.png"]), np.zeros(1), recall_at=(1, 2))
nmi: float = figures["nmi"]
'''
"""Good calls, and three mistakes a type checker must name: a checkpoint given as an int, an embedding size as
text, and ``nmi`` (None where it is undefined) taken for a float."""


def test_mypy_names_wrong_argument_types_in_the_public_api(tmp_path: Path) -> None:
    calls = tmp_path / "calls.py"
    calls.write_text(CALLS)
    env = {**os.environ, "MYPYPATH": str(ROOT / "src")}  # this checkout's package, whatever is installed
    result = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                             "--no-error-summary", "--hide-error-context", str(calls)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    errors = [re.sub(r"^.*calls\.py:", "calls.py:", line) for line in result.stdout.splitlines()
              if re.match(r".*calls\.py:\d+: error:", line)]
    assert errors == [
        'calls.py:9: error: Argument "checkpoint" to "load_run" has incompatible type "int"; expected '
        '"str | PathLike[str]"  [arg-type]',
        'calls.py:11: error: Argument "embedding_dim" to "create_model" has incompatible type "str"; expected "int"  '
        '[arg-type]',
        'calls.py:13: error: Incompatible types in assignment (expression has type "float | None", variable has type '
        '"float")  [assignment]',
    ], result.stdout + result.stderr
    assert result.returncode == 1
