"""pytorch-metric-learning's losses and miners as deepmetric metric losses (the optional extra ``deepmetric[pml]``).

``loss.name: pml:<LossClass>`` with ``loss.options`` passed to the class, and ``loss.miner: pml:<MinerClass>`` with
``loss.miner_options``. ``num_classes`` and ``embedding_size`` are filled in from the run (the training classes, the
width of the embedding or of each part the loss is on). The loss composes like the built-in ones: on the embedding
or one copy per part (``loss.on: parts``, ABE's and DeML's learners), beside the method's regularisers, on the
all-gathered batch under distributed training. A loss with parameters (proxies, class weights) keeps them in the
objective: they train in the optimiser's ``loss`` group (``train.lr_loss``; unset, 100 x ``train.lr_backbone``, the
proxies' rate in Proxy Anchor's code, which PML's documentation follows in giving them their own optimiser), are
saved in the checkpoint and resume exactly.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError, did_you_mean
from .pairs import check_reference
from .registry import LOSSES, MINERS

PREFIX = "pml"
INSTALL = "pip install 'deepmetric[pml]' (or pip install pytorch-metric-learning)"
PROXY_LR_FACTOR = 100.0
"""Unset ``train.lr_loss``, a PML loss's own parameters train at this multiple of ``train.lr_backbone``."""


def _module(kind: str) -> Any:
    try:
        if kind == "loss":
            from pytorch_metric_learning import losses as module
        else:
            from pytorch_metric_learning import miners as module
    except ImportError:
        raise ConfigError(f"the {kind} names 'pml:...' need pytorch-metric-learning, which is not installed: "
                          f"{INSTALL}") from None
    return module


def _classes(kind: str) -> dict[str, type]:
    """PML's public {loss or miner} classes by name (their base classes left out)."""
    module = _module(kind)
    if kind == "loss":
        from pytorch_metric_learning.losses import BaseMetricLossFunction as base
    else:
        from pytorch_metric_learning.miners import BaseMiner as base
    return {name: cls for name, cls in vars(module).items()
            if inspect.isclass(cls) and issubclass(cls, base) and not name.startswith("Base")}


def resolve(kind: str, name: str) -> type:
    """PML's {loss or miner} class ``name``; an unknown one is refused with the nearest names."""
    classes = _classes(kind)
    if name not in classes:
        raise ConfigError(f"pytorch-metric-learning has no {kind} '{name}'{did_you_mean(name, classes)}; its "
                          f"{kind} classes are: {', '.join(sorted(classes))}")
    return classes[name]


def is_pml(name: str | None) -> bool:
    return bool(name) and str(name).startswith(f"{PREFIX}:")


def has_parameters(loss: nn.Module) -> bool:
    return any(p.requires_grad for p in loss.parameters())


def memory_losses() -> list[str]:
    """The PML losses a cross-batch memory (``loss.memory``) may be used with: those PML's own ``CrossBatchMemory``
    supports (pair- and triplet-based; proxy and classification losses take no reference set)."""
    from pytorch_metric_learning.losses import CrossBatchMemory

    return sorted(CrossBatchMemory.supported_losses())


class PMLLoss(nn.Module):
    """``(embeddings, labels) -> PML loss(embeddings, labels, indices_tuple)``, the indices being the miner's (all
    pairs or triplets without one): the built-in losses' call, so the objective does not know whose loss it is. With a
    reference set (``ref_emb``, ``ref_labels``: a cross-batch memory) the batch's rows are paired with the
    reference's, by PML's own ``ref_emb`` arguments, the miner mining those pairs."""

    def __init__(self, loss: nn.Module, miner: nn.Module | None = None):
        super().__init__()
        self.loss, self.miner = loss, miner

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor, ref_emb: torch.Tensor | None = None,
                ref_labels: torch.Tensor | None = None) -> torch.Tensor:
        if ref_emb is None:
            indices = self.miner(embeddings, labels) if self.miner is not None else None
            return self.loss(embeddings, labels, indices)
        check_reference(embeddings, ref_emb, ref_labels)
        indices = self.miner(embeddings, labels, ref_emb, ref_labels) if self.miner is not None else None
        return self.loss(embeddings, labels, indices, ref_emb, ref_labels)


LOSSES.register_prefix("pml", lambda name: resolve("loss", name))
MINERS.register_prefix("pml", lambda name: resolve("miner", name))
