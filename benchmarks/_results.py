"""What every benchmark script records beside its figures, and how it writes them."""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

import torch

from deepmetric.hardware import cpu_info


def environment() -> dict[str, Any]:
    """The run's conditions: torch threads, torch version, processor."""
    return {"threads": torch.get_num_threads(), "torch": torch.__version__,
            "machine": platform.processor() or platform.machine(), "cpu": cpu_info("model name")}


def write_result(out: str | Path, result: dict[str, Any]) -> None:
    """Write ``result`` as indented JSON to ``out``, creating its folder."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
