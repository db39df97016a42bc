"""What every benchmark script records beside its figures, how it writes them, shared timers (which wait for
the GPU's queued work when they time a CUDA device: its kernels run asynchronously) and the FLOP counter."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch.utils.flop_counter import FlopCounterMode

from deepmetric.provenance import environment as provenance

T = TypeVar("T")


def environment(device: str | torch.device = "cpu") -> dict[str, Any]:
    """The run's conditions (``deepmetric.provenance``): versions, deepmetric's commit, processor, torch threads,
    and the GPU's name when ``device`` is a CUDA device."""
    return provenance(device)


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device) -> float:
    """Seconds of one call of ``fn``, from an idle ``device`` to the end of the work it queued there."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def forward_macs(model: torch.nn.Module, images: torch.Tensor) -> float:
    """Multiply-adds of one forward pass of ``model`` (in the mode it is in) per image of ``images``, counted by
    ``torch.utils.flop_counter``: convolutions, matrix products and einsums; element-wise work is not counted."""
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(images)
    return counter.get_total_flops() / 2 / images.shape[0]


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


def rotated(items: Sequence[T], turn: int) -> list[T]:
    """``items`` started ``turn`` places further along: round ``turn``'s order of a benchmark's set-ups, so that over
    its rounds none always runs first or last (drift over a run, and a process's start, then weigh on each alike)."""
    shift = turn % len(items)
    return list(items[shift:]) + list(items[:shift])
