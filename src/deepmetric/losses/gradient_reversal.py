"""The gradient-reversal layer (Ganin et al., JMLR 2016), which turns DeML's max-min game (eq. 4) into one
minimisation: forward ``GRL(x) = x``, backward ``dL/dx <- -lambda dL/dx``. Everything before the layer then
descends ``-lambda L`` while everything after it descends ``L``.

DeML uses a constant lambda = 1 here. The DeML authors' ``gradients_reverse_layer`` ramps it as Ganin's
schedule, ``2 / (1 + exp(-10 p)) - 1`` with p the training progress over 10k iterations; the paper does not
mention it, and it is not reproduced (docs/reproduce.md)."""

from __future__ import annotations

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
