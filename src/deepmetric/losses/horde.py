"""HORDE: high-order regularisation of the local features (thesis ch. 5, ICCV 2019).

Training-only. From the local feature map the head exposes (``HeadOutput.extras["feature_map"]``), the
moment approximations of orders k = 2..K are pooled after the products (``HighOrderMoments``, eq. 5.4-5.8),
each is embedded by its own linear layer without bias (d -> 512) and l2-normalised, and the run's metric
loss is put on every order with unit weights (eq. 5.9):

    L = L_DML(first-order embedding) + sum_{k=2..K} L_k(e_k),   e_k = l2(E_k^T mean_i phi_k(x_i))

The first term is the objective's metric loss; this regulariser returns the sum (``reduction="mean"``
divides it by K - 1, the weighting the authors' code uses for ABE + HORDE). Add it with
``loss.regularizers: {horde: {...}}`` or ``deepmetric train --regularizer horde``.

- **Which loss**: by default each order gets its own copy of the run's metric loss (``loss.name`` and
  ``loss.options``, built by the objective through the ``metric_loss`` factory every regulariser may ask
  for), as the thesis does (L_k = L_DML); ``loss`` / ``loss_options`` choose another.
- **Test time**: the head is untouched, so the retrieval embedding is the head's own first-order one
  (eq. 5.10) and the HORDE parameters, which live in the objective, are not part of the model.
  ``embeddings(output)`` gives the per-order embeddings for per-order evaluation and the † variant
  (``deepmetric evaluate RUN --all-embeddings``).
- **Defaults**: K = 5 (orders 2..5, the authors' ``run_cub.sh``), d = 8192, 512-d embeddings (the head's
  embedding size), ``mode="cascaded"`` (Algorithm 1), no 1/sqrt(d) factor (the authors' code; the factor
  is a positive constant in front of the pooled moments, which the linear embedding and the l2
  normalisation cancel exactly, so it changes the range of the values only, not the loss or its
  gradients). ``embedding_dim=0`` drops the per-order embeddings (Table 5.3: the loss acts on the
  l2-normalised d-dimensional moments).
- **Training** (``rate``, ``init``): the thesis and the authors' code train every weight with one Adam rate
  (1e-5, backbone included), so HORDE's parameters form an optimiser group of their own, ``horde``, at the
  backbone's rate (``rate="backbone"``, the default: ``train.lr_backbone``); ``rate="head"`` puts them at the
  new layers' ``train.lr`` instead (this project's behaviour before 2026-11-26, when they sat in the ``loss``
  group: at 10 x the backbone's rate one Adam step took the summed HORDE loss from 4.06 to 42.0).
  ``train.groups.horde.lr_scale`` scales either. The per-order embeddings start Glorot-uniform, as the
  authors' Keras ``Dense`` layers (``init="glorot"``, the default; about 2.4 times the width of PyTorch's
  default ``Linear`` initialisation at d = 8192, D = 512); ``init="torch"`` keeps PyTorch's.
- **ABE + HORDE** (thesis §5.5.3, Table 5.1): the authors' code feeds HORDE the 8 learners' inception-5b
  maps concatenated (8 x 1024 channels; the ABE head's ``branch_feature_map``) through a 1 x 1 convolution
  without bias down to 1024 channels (``reduce_channels=1024``; Glorot-uniform initialised, as Keras'
  default), weighting each order 1/(K - 1) (``reduction="mean"``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from ..models.heads import Head, HeadOutput
from ..models.high_order import HighOrderMoments
from ..models.init import glorot_uniform_
from .registry import REGULARIZERS

GROUP_RATES = ("backbone", "head")
"""Base rates a regulariser's own optimiser group may take: ``train.lr_backbone`` or ``train.lr``."""


@REGULARIZERS.register("horde")  # thesis ch. 5
class HordeRegularizer(nn.Module):
    def __init__(self, head: Head, metric_loss: Callable[[], nn.Module], num_classes: int | None = None,
                 orders: int = 5, dim: int = 8192, mode: str = "cascaded", embedding_dim: int | None = None,
                 scale: bool = False, seed: int = 0, reduction: str = "sum", loss: str | None = None,
                 loss_options: dict[str, Any] | None = None, reduce_channels: int | None = None,
                 rate: str = "backbone", init: str = "glorot"):
        super().__init__()
        if rate not in GROUP_RATES:
            raise ConfigError(f"regularizer 'horde': rate must be one of {', '.join(GROUP_RATES)}, got '{rate}'")
        if init not in ("glorot", "torch"):
            raise ConfigError(f"regularizer 'horde': init must be 'glorot' or 'torch', got '{init}'")
        self.parameter_group, self.group_rate = "horde", rate  # build_optimizer's group and its base rate
        channels = head.feature_channels
        if not channels:
            raise ConfigError(f"regularizer 'horde' needs a head that exposes its local feature map "
                              f"(extras['feature_map'] and feature_channels); head {type(head).__name__} does not")
        if reduction not in ("sum", "mean"):
            raise ConfigError(f"regularizer 'horde': reduction must be 'sum' or 'mean', got '{reduction}'")
        if loss is None and loss_options:
            raise ConfigError("regularizer 'horde': loss_options needs loss (the name of the loss they configure)")
        if reduce_channels is not None and reduce_channels < 1:
            raise ConfigError(f"regularizer 'horde': reduce_channels must be at least 1, got {reduce_channels}")
        self.reduce: nn.Module = nn.Identity()
        if reduce_channels:
            reduce = nn.Conv2d(channels, reduce_channels, kernel_size=1, bias=False)
            nn.init.xavier_uniform_(reduce.weight)
            self.reduce = reduce
            channels = reduce_channels
        self.moments = HighOrderMoments(channels, orders=orders, dim=dim, mode=mode, scale=scale, seed=seed)
        embedding_dim = head.embedding_dim if embedding_dim is None else embedding_dim
        layers = [nn.Linear(dim, embedding_dim, bias=False) for _ in range(orders - 1)] if embedding_dim else []
        if init == "glorot":
            for layer in layers:
                glorot_uniform_(layer.weight, dim, embedding_dim)
        self.embed = nn.ModuleList(layers or [nn.Identity() for _ in range(orders - 1)])
        if loss is not None:
            from . import build_loss

            def metric_loss() -> nn.Module:
                return build_loss(loss, loss_options, num_classes)
        self.losses = nn.ModuleList(metric_loss() for _ in range(orders - 1))
        self.reduction = reduction

    def group_parameters(self) -> list[nn.Parameter]:
        """HORDE's own weights (the ``horde`` optimiser group): the channel reduction, the moments' projections
        and the per-order embeddings; the per-order losses' parameters, if any, stay in the ``loss`` group."""
        return [*self.reduce.parameters(), *self.moments.parameters(), *self.embed.parameters()]

    def embeddings(self, output: HeadOutput) -> dict[str, torch.Tensor]:
        """``{"order2": e_2, ..., "orderK": e_K}``, each (B, D) l2-normalised."""
        feature_map = output.extras.get("feature_map")
        if feature_map is None:
            raise ConfigError("regularizer 'horde' needs extras['feature_map'] in the head's output")
        pooled = self.moments(self.reduce(feature_map))
        return {f"order{k}": F.normalize(layer(m), dim=1)
                for k, (layer, m) in enumerate(zip(self.embed, pooled, strict=True), start=2)}

    def forward(self, output: HeadOutput, labels: torch.Tensor) -> torch.Tensor:
        per_order = [loss(e, labels) for loss, e in zip(self.losses, self.embeddings(output).values(), strict=True)]
        total = torch.stack(per_order).sum()
        return total / len(per_order) if self.reduction == "mean" else total
