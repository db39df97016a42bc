"""The optimiser: Adam with one parameter group per learning rate, and the step-wise schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..config import TrainConfig
from ..models import Embedder


def build_optimizer(model: Embedder, objective: nn.Module, config: TrainConfig) -> torch.optim.Adam:
    """Adam over ``pretrained`` (``lr_backbone``), ``new`` (``lr``) and ``loss`` (``lr_loss``) parameters.

    The papers train everything with Adam at 1e-5 (DIABLO §4.4.6; HORDE code); the groups let a run
    give new layers (and learned loss parameters such as margin's beta) their own rate.
    """
    groups_of_model = model.parameter_groups()
    rates = {"pretrained": config.lr_backbone, "new": config.lr,
             "loss": config.lr_loss if config.lr_loss is not None else config.lr}
    params = {"pretrained": groups_of_model["pretrained"], "new": groups_of_model["new"],
              "loss": [p for p in objective.parameters() if p.requires_grad]}
    groups = [{"params": params[name], "lr": rates[name], "initial_lr": rates[name], "name": name}
              for name in ("pretrained", "new", "loss") if params[name]]
    return torch.optim.Adam(groups, weight_decay=config.weight_decay)


def schedule_factor(schedule: str, step: int, total: int) -> float:
    """Multiplier of the initial learning rates at ``step`` (0-based) of ``total``."""
    if schedule == "cosine" and total > 0:
        return 0.5 * (1.0 + math.cos(math.pi * min(step, total) / total))
    return 1.0


def apply_schedule(optimizer: torch.optim.Optimizer, schedule: str, step: int, total: int) -> None:
    factor = schedule_factor(schedule, step, total)
    for group in optimizer.param_groups:
        group["lr"] = group["initial_lr"] * factor
