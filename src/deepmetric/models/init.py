"""Weight initialisations shared by the heads."""

from __future__ import annotations

import math

import torch
from torch import nn


def glorot_uniform_(weight: torch.Tensor, fan_in: int, fan_out: int) -> torch.Tensor:
    """Glorot & Bengio's uniform initialisation U(±sqrt(6 / (fan_in + fan_out))), in place, with the fans of one
    layer given explicitly: for several layers stored stacked in one tensor (per learner, per gate), whose shape
    would give ``nn.init.xavier_uniform_`` the wrong fans."""
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    with torch.no_grad():
        return nn.init.uniform_(weight, -bound, bound)


def caffe_xavier_uniform_(weight: torch.Tensor, fan_in: int) -> torch.Tensor:
    """Caffe's ``xavier`` filler with its default ``variance_norm: FAN_IN``: U(±sqrt(3 / fan_in)), in place, so
    that each output unit's weight vector has an expected squared norm of 1 (what authors' Caffe models start
    from; it is not Glorot & Bengio's rule, which also counts the fan-out)."""
    bound = math.sqrt(3.0 / fan_in)
    with torch.no_grad():
        return nn.init.uniform_(weight, -bound, bound)
