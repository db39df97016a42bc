"""The gradient-reversal layer (Ganin et al., JMLR 2016), which turns DeML's max-min game (eq. 4) into one
minimisation: forward ``GRL(x) = x``, backward ``dL/dx <- -lambda dL/dx``. Everything before the layer then
descends ``-lambda L`` while everything after it descends ``L``.

The DeML paper does not say how lambda is set; the authors' ``gradients_reverse_layer`` ramps it with Ganin's
schedule (``ganin_lambda``), which ``deml-adversary`` follows by default (``ramp_steps``)."""

from __future__ import annotations

import math
from typing import Any

import torch


class _Reverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return -ctx.scale * grad, None


def reverse_gradient(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Identity forward; the gradient flowing back through it is multiplied by ``-scale``."""
    return _Reverse.apply(x, scale)


def ganin_lambda(step: int, ramp_steps: int) -> float:
    """Ganin et al.'s schedule (JMLR 2016, §5.2.2): ``lambda_p = 2 / (1 + exp(-10 p)) - 1`` with the progress
    ``p = step / ramp_steps`` (held at 1 after ``ramp_steps``): 0 at the start, 0.46 at p = 0.1, 0.99991 at
    p = 1. The DeML code's ``gradients_reverse_layer`` computes it with p = iteration / ``max_iter`` (10,000 by
    default). ``ramp_steps=0`` gives a constant 1."""
    if ramp_steps <= 0:
        return 1.0
    progress = min(max(step, 0) / ramp_steps, 1.0)
    return 2.0 / (1.0 + math.exp(-10.0 * progress)) - 1.0
