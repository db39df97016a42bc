"""What every benchmark script records beside its figures, how it writes them, and a shared timer."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deepmetric.provenance import environment as provenance


def environment() -> dict[str, Any]:
    """The run's conditions (``deepmetric.provenance``): versions, deepmetric's commit, processor, torch threads."""
    return provenance("cpu")


def write_result(out: str | Path, result: dict[str, Any]) -> None:
    """Write ``result`` as indented JSON to ``out``, creating its folder."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


def per_row_ms(fn: Callable[[], Any], rows: int, repeats: int) -> float:
    """Median milliseconds per row of ``fn`` (which handles ``rows`` rows) over ``repeats`` calls, after a warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times) / rows
