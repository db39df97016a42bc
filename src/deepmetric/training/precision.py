"""``train.amp``: the arithmetic of the training step.

- ``false``: float32 throughout.
- ``bf16`` (``true``): the forward pass under bfloat16 autocast. bfloat16 has float32's exponent range, so
  gradients need no scaling.
- ``fp16``: the forward pass under float16 autocast and a gradient scaler (``torch.amp.GradScaler``): float16's
  range ends at 65,504 and its smallest normal is 6e-5, so the loss is multiplied by a scale (65,536 at first)
  before the backward pass, lest small gradients flush to zero; the gradients are divided by it before the
  optimiser's step; a step whose gradients hold an inf or a NaN is skipped (the optimiser's state untouched) and the
  scale halved; 2,000 clean steps in a row double it. The skipped steps are counted: the log's ``skipped_steps``
  (the run's total so far) and ``loss_scale``. A run whose steps are skipped ``MAX_SKIPPED_IN_A_ROW`` times in a
  row is stopped: its gradients overflow float16 at any scale, and nothing trains.

In every mode the objective (the metric loss and every regulariser) is computed in float32: the head's output is
cast (differentiably) and autocast switched off around the objective, in ``Precision.objective`` alone, so no loss
is ever written for a low precision. Metric losses exponentiate scaled similarities (multi-similarity's beta = 50,
binomial deviance's 2 x 25, a proxy loss's alpha = 32): ``exp(35)`` is 1.6e15, infinite in float16
(pytorch-metric-learning issues #121 and #233 are such overflows).

The scaler's state (scale, growth tracker) and the count of skipped steps go into ``last`` (JSON, in the
checkpoint's header), so a resumed fp16 run continues as an uninterrupted one. The learning-rate schedule is a
function of the step (``optim.apply_schedule``), so a skipped step moves it on as any other: nothing is out of
order when the optimiser does not step. ``generator.name`` (MIRAGE) is refused with fp16 (``config.validate``):
its prototypes are stepped by its own optimiser with gradients of the trainer's backward pass, which the scale
multiplies. ``train.compile`` compiles the forward pass under whichever autocast is on; the scaler works outside it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from ..config.validate import amp_mode
from ..errors import TrainingError
from ..losses import Objective
from ..models.heads import HeadOutput

log = logging.getLogger("deepmetric")

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""The autocast type of each ``train.amp`` mode."""
MAX_SKIPPED_IN_A_ROW = 30
"""Steps skipped in a row (inf/NaN gradients) after which an fp16 run stops: the scale has fallen from 2^16 to
2^-14 (fairseq stops at a scale of 1e-4), so the gradients overflow float16 unscaled."""


class Precision:
    """The training step's precision: autocast for the forward pass, the objective in float32, and under fp16
    the gradient scaler, the count of the steps it skipped and their place in ``last``."""

    def __init__(self, amp: str | bool, device: torch.device):
        self.mode = amp_mode(amp)
        self.device_type = device.type
        self.dtype = AMP_DTYPES.get(self.mode) if self.mode else None
        self.scaler = torch.amp.GradScaler(device.type) if self.mode == "fp16" else None
        self.skipped = 0
        """Steps the scaler skipped over the whole run (resumed sessions included)."""
        self.in_a_row = 0

    def autocast(self) -> torch.autocast:
        """The forward pass's context: autocast to ``dtype``, or autocast off (also inside a caller's own)."""
        return torch.autocast(self.device_type, dtype=self.dtype or torch.bfloat16, enabled=self.dtype is not None)

    def float32(self, output: HeadOutput) -> HeadOutput:
        """The head's output as the objective (and an example generator) gets it: every floating tensor in float32,
        differentiably (``HeadOutput.float``)."""
        return output.float() if self.dtype is not None else output

    def objective(self, objective: Objective, output: HeadOutput, labels: torch.Tensor,
                  generated: tuple[torch.Tensor, torch.Tensor] | None = None
                  ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``objective(output, labels, generated)`` in float32: the output cast, autocast off (also where a caller
        runs ``train`` inside an autocast of its own), so every loss and regulariser computes in float32."""
        with torch.autocast(self.device_type, enabled=False):
            return objective(self.float32(output), labels, generated)

    def backward_and_step(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer, step: int,
                          where: Callable[[], str] = lambda: "") -> bool:
        """``loss.backward()`` and ``optimizer.step()``; under fp16 through the scaler (the loss scaled, the
        gradients unscaled before the step, which is skipped when one of them is inf or NaN, then the scale
        updated). Returns whether the optimiser stepped; a skipped step is counted, and ``MAX_SKIPPED_IN_A_ROW``
        in a row stop the run (``step`` is the 1-based step; ``where()`` says where the last good checkpoint is)."""
        if self.scaler is None:
            loss.backward()
            optimizer.step()
            return True
        self.scaler.scale(loss).backward()
        scale = self.scaler.get_scale()
        self.scaler.step(optimizer)  # unscale_ first, then step unless a gradient is inf/NaN
        self.scaler.update()
        # the scale falls (x backoff_factor < 1) exactly when the step was skipped; it stays or grows otherwise
        if self.scaler.get_scale() >= scale:
            self.in_a_row = 0
            return True
        self.skipped += 1
        self.in_a_row += 1
        log.debug("step %d: float16 gradients overflowed at loss scale %g; step skipped, scale now %g", step, scale,
                  self.scaler.get_scale())
        if self.in_a_row >= MAX_SKIPPED_IN_A_ROW:
            detail = where()
            raise TrainingError(f"step {step}: train.amp=fp16 skipped {self.in_a_row} steps in a row (their "
                                f"gradients held inf or NaN at every loss scale down to {scale:g}): nothing is "
                                f"training; use train.amp=bf16 or false" + (f" ({detail})." if detail else "."))
        return False

    def log_fields(self) -> dict[str, float]:
        """What a training record adds under fp16 (``runs.folder.AMP_LOG_KEYS``, which the report and TensorBoard
        read apart from the loss terms): the run's skipped steps and the current scale."""
        if self.scaler is None:
            return {}
        return {"skipped_steps": self.skipped, "loss_scale": self.scaler.get_scale()}

    def state(self) -> dict[str, Any] | None:
        """The scaler's state for ``last`` (JSON: the scale is a power of two, exact in JSON), or None."""
        if self.scaler is None:
            return None
        return {"scaler": self.scaler.state_dict(), "skipped_steps": self.skipped, "skipped_in_a_row": self.in_a_row}

    def load_state(self, state: dict[str, Any] | None) -> None:
        """Restore ``state`` (``Precision.state`` of ``last``). An fp16 session resuming a checkpoint without one
        (the run trained in float32 or bf16 until then) starts the scaler afresh; a checkpoint's scaler is unused
        by a session that is not fp16."""
        if self.scaler is None:
            if state is not None:
                log.info("the checkpoint's fp16 gradient scaler is not used: this session trains with train.amp=%s",
                         self.mode if self.mode else "false")
            return
        if not isinstance(state, dict) or not isinstance(state.get("scaler"), dict):
            log.info("train.amp=fp16 from this session on: the gradient scaler starts at scale %g",
                     self.scaler.get_scale())
            return
        self.scaler.load_state_dict(state["scaler"])
        self.skipped = int(state.get("skipped_steps", 0))
        self.in_a_row = int(state.get("skipped_in_a_row", 0))
