"""What the training loop watches step by step: a loss that is not finite (it stops the run), one that stays exactly
the same (a warning: nothing is learning), and the running figures between two log records (images/s, the smoothed
loss the progress bar shows)."""

from __future__ import annotations

import logging
import math
import time

import torch

from ..errors import TrainingError
from ..runs.folder import RunDir

log = logging.getLogger("deepmetric")


def last_good(run: RunDir) -> str:
    return f"the last good checkpoint is {run.last}" if run.last.is_file() else "no checkpoint was written yet"


def check_finite(loss: torch.Tensor, terms: dict[str, torch.Tensor], step: int, run: RunDir,
                 amp: str | bool = False) -> float:
    """Stop on a NaN/Inf loss, naming the step and the first non-finite term; ``last`` stays the last good one.
    Returns the loss as a float: the one value the step reads from the device, before the backward pass is queued
    (on a GPU the host then waits for the forward pass only, and prepares the next batch while the backward pass and
    the optimiser's step run). (Under fp16 the loss is finite on a step the gradient scaler skips: its overflow is in
    the backward pass; an infinite loss is an overflow of the forward pass, which no scale helps.)"""
    value = float(loss.detach())
    if not math.isfinite(value):
        _stop(terms, value, step, run, amp)
    return value


def check_terms_finite(terms: dict[str, torch.Tensor], step: int, run: RunDir) -> None:
    """Stop on any non-finite term (after an example generator's own step adds its terms): all of them in one read
    from the device, and the failing one named."""
    if not terms:
        return
    device = next(iter(terms.values())).device
    if bool(torch.cat([t.detach().float().reshape(-1).to(device) for t in terms.values()]).isfinite().all()):
        return
    _stop(terms, math.nan, step, run)


def _stop(terms: dict[str, torch.Tensor], total: float, step: int, run: RunDir, amp: str | bool = False) -> None:
    bad = next((name for name, term in terms.items() if not torch.isfinite(term).all()), "total")
    bad_value = float(terms[bad].detach()) if bad in terms else total
    hint = (" (train.amp=fp16: the forward pass may have overflowed float16, whose range ends at 65,504; "
            "train.amp=bf16 keeps float32's range)" if amp == "fp16" else "")
    raise TrainingError(f"step {step}: the loss term '{bad}' is {bad_value}{hint}; training stopped "
                        f"({last_good(run)}).")


CONSTANT_LOSS_STEPS = 50
"""After this many consecutive steps at exactly the same training loss, the trainer warns once."""


class ConstantLoss:
    """Watch for a training loss that stays *exactly* the same step after step: no gradient reaches the model
    (margins every pair satisfies, a term zeroed by a NaN option). ``update`` returns ``(first, last)`` step of the
    run once it reaches ``steps`` equal values, and only that once per training."""

    value: float | None

    def __init__(self, steps: int):
        self.steps, self.value, self.first, self.said = steps, None, 0, False

    def update(self, step: int, value: float) -> tuple[int, int] | None:
        if value != self.value:
            self.value, self.first = value, step
            return None
        if self.said or step - self.first + 1 < self.steps:
            return None
        self.said = True
        return self.first, step


class StepLog:
    """The running figures between two log records: the images trained since the window started (validation time
    is left out: ``restart`` after it) and an exponentially smoothed loss for the progress bar."""

    smoothed: float | None

    def __init__(self) -> None:
        self.window_start, self.images, self.smoothed = time.perf_counter(), 0, None

    def step(self, images: int, loss: float) -> None:
        self.images += images
        self.smoothed = loss if self.smoothed is None else 0.9 * self.smoothed + 0.1 * loss

    def rate(self) -> float:
        """Images per second since the window started."""
        return self.images / max(time.perf_counter() - self.window_start, 1e-9)

    def restart(self, keep_images: bool = False) -> None:
        """Start a new window (after a log record), or only move its start past a validation (``keep_images``)."""
        self.window_start = time.perf_counter()
        if not keep_images:
            self.images = 0
