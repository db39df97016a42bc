"""The optimiser: Adam with one parameter group per named group of the model and the loss, and the schedule."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..config import TrainConfig
from ..errors import ConfigError
from ..losses import PMLLoss
from ..losses.pml import PROXY_LR_FACTOR, has_parameters
from ..models import Embedder


def loss_lr(objective: nn.Module, config: TrainConfig) -> float:
    """The base rate of the ``loss`` group: ``train.lr_loss``; unset, ``train.lr``, or for a pytorch-metric-learning
    loss with parameters (proxies) ``PROXY_LR_FACTOR`` x ``train.lr_backbone`` (``deepmetric.losses.pml``)."""
    if config.lr_loss is not None:
        return config.lr_loss
    if any(isinstance(m, PMLLoss) and has_parameters(m) for m in objective.modules()):
        return PROXY_LR_FACTOR * config.lr_backbone
    return config.lr


def objective_groups(objective: nn.Module) -> tuple[dict[str, list[nn.Parameter]], dict[str, str]]:
    """The optimiser groups that parts of the objective ask for (a module with ``parameter_group``, its name,
    ``group_rate``, ``backbone`` or ``head``, and ``group_parameters()``: e.g. HORDE's ``horde`` group): their
    trainable parameters and base rates. Every other parameter of the objective is in the ``loss`` group."""
    groups: dict[str, list[nn.Parameter]] = {}
    rates: dict[str, str] = {}
    for module in objective.modules():
        name = getattr(module, "parameter_group", None)
        if name:
            group: Any = module  # a module that names a group has group_parameters() and group_rate (docstring)
            groups.setdefault(name, []).extend(p for p in group.group_parameters() if p.requires_grad)
            rates[name] = group.group_rate
    return {n: g for n, g in groups.items() if g}, {n: r for n, r in rates.items() if groups[n]}


def build_optimizer(model: Embedder, objective: nn.Module, config: TrainConfig) -> torch.optim.Adam:
    """Adam over the model's named parameter groups plus ``loss`` (parameters living in the objective).

    Base learning rates: ``pretrained`` -> ``lr_backbone``, ``loss`` -> ``lr_loss`` (default ``lr``), a group
    the objective asks for (``objective_groups``: HORDE's ``horde``) -> its ``group_rate``, every other group
    (``new`` and a head's own) -> ``lr``; ``train.groups.<name>.lr_scale`` multiplies it and
    ``train.groups.<name>.weight_decay`` replaces ``weight_decay``; the head's ``default_groups`` give the values
    the config leaves unset. The papers train everything with Adam
    at 1e-5 (DIABLO §4.4.6; HORDE code); groups let a method give its parts their own rates (DeML's
    learners at 10x, DGML's queries) and a learned loss parameter (margin's beta) its own.
    """
    params = dict(model.parameter_groups())
    own, own_rates = objective_groups(objective)
    owned = {id(p) for group in own.values() for p in group}
    loss_params = [p for p in objective.parameters() if p.requires_grad and id(p) not in owned]
    if loss_params:
        params["loss"] = loss_params
    params.update(own)
    unknown = set(config.groups) - set(params)
    if unknown:
        raise ConfigError(f"train.groups names {sorted(unknown)}, but this model's parameter groups are "
                          f"{sorted(params)}")
    rates = {"backbone": config.lr_backbone, "head": config.lr}
    base = {"pretrained": config.lr_backbone, "loss": loss_lr(objective, config),
            **{name: rates[rate] for name, rate in own_rates.items()}}
    groups = []
    for name, group_params in params.items():
        options = {**model.head.default_groups.get(name, {}), **config.groups.get(name, {})}
        lr = base.get(name, config.lr) * float(options.get("lr_scale", 1.0))
        decay = float(options.get("weight_decay", config.weight_decay))
        groups.append({"params": group_params, "lr": lr, "initial_lr": lr, "weight_decay": decay, "name": name})
    return torch.optim.Adam(groups)


def schedule_factor(schedule: str, step: int, total: int, milestones: Sequence[int] = (),
                    gamma: float = 0.1) -> float:
    """Multiplier of the initial learning rates at ``step`` (0-based) of ``total``: 1 (``constant``),
    (1 + cos(pi step / total)) / 2 (``cosine``), or gamma ** (milestones reached, ``step``)."""
    if schedule == "cosine" and total > 0:
        return 0.5 * (1.0 + math.cos(math.pi * min(step, total) / total))
    if schedule == "step":
        return gamma ** bisect.bisect_right(milestones, step)
    return 1.0


def apply_schedule(optimizer: torch.optim.Optimizer, schedule: str, step: int, total: int,
                   milestones: Sequence[int] = (), gamma: float = 0.1) -> None:
    factor = schedule_factor(schedule, step, total, milestones, gamma)
    for group in optimizer.param_groups:
        group["lr"] = group["initial_lr"] * factor
