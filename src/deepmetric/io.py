"""Writing what other programs read: strict JSON.

Every machine-readable output (``--json``, ``metrics.json``, ``baseline.json``, ``metrics.jsonl``, the service's
answers) is RFC 8259 JSON: Python's ``json`` writes ``NaN`` and ``Infinity``, which ``jq``, browsers'
``JSON.parse`` and strict parsers refuse. An undefined value (NMI of queries of one class) is ``null``.
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite_or_none(value: Any) -> Any:
    """``value`` with every NaN or infinite float (in lists, tuples and dicts too) replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_none(v) for v in value]
    return value


def to_json(value: Any, **options: Any) -> str:
    """``json.dumps`` that writes strict JSON: non-finite floats become ``null`` (``options`` as json.dumps')."""
    return json.dumps(finite_or_none(value), allow_nan=False, **options)
