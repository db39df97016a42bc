"""Metric losses on cosine similarities of l2-normalised embeddings, over all pairs/triplets of a batch.

| name | loss | defaults |
|---|---|---|
| ``contrastive`` | thesis eq. 2.12 | margin 0.5 |
| ``contrastive-euclidean`` | ABE eq. 10 (Euclidean distance) | margin 1 |
| ``triplet`` | thesis eq. 2.14 | margin 0.1 |
| ``binomial`` | binomial deviance, eq. 2.18 | alpha 2, beta 0.5, negative_weight 25 |
| ``multi-similarity`` | Wang et al. 2019, eq. 2.20 | alpha 2, beta 50, base 0.5, mining |
| ``margin`` | Wu et al. 2017 | margin 0.2, beta 1.2 (learned) |
| ``pml:<Class>`` | any pytorch-metric-learning loss (``pml.py``), with ``loss.miner: pml:<Miner>`` | PML's |

Regularisers (``loss.regularizers.<name>``) have their own table in ``regularizers.py``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..errors import ConfigError
from ..models.heads import Head
from ..registry import Registry
from .activation_decay import ActivationDecay, LearnerRowNorm
from .binomial import BinomialDevianceLoss
from .contrastive import ContrastiveLoss, EuclideanContrastiveLoss
from .deml_diversity import DeMLAdversary, DeMLPairHinge
from .divergence import ABEDivergenceLoss
from .diversity import DiversityLoss
from .horde import HordeRegularizer
from .margin import MarginLoss
from .multi_similarity import MultiSimilarityLoss
from .objective import Objective
from .pml import PMLLoss, is_pml
from .pml import resolve as resolve_pml
from .regularizers import REGULARIZERS, build_regularizer, check_regularizer_options, register_regularizer
from .triplet import TripletLoss

LOSSES: Registry[type[nn.Module]] = Registry("loss", provided=("num_classes", "embedding_size"))
for _name, _cls in {"contrastive": ContrastiveLoss, "contrastive-euclidean": EuclideanContrastiveLoss,
                    "triplet": TripletLoss, "binomial": BinomialDevianceLoss,
                    "multi-similarity": MultiSimilarityLoss, "margin": MarginLoss}.items():
    LOSSES.register(_name, _cls)
LOSSES.register_prefix("pml", lambda name: resolve_pml("loss", name))

MINERS: Registry[type[nn.Module]] = Registry("miner", error=ConfigError)
"""Pair and triplet miners for ``loss.miner`` (pytorch-metric-learning's, ``pml:<Class>``)."""
MINERS.register_prefix("pml", lambda name: resolve_pml("miner", name))

__all__ = [
    "LOSSES", "MINERS", "REGULARIZERS", "ABEDivergenceLoss", "ActivationDecay", "BinomialDevianceLoss",
    "ContrastiveLoss", "DeMLAdversary", "DeMLPairHinge", "DiversityLoss", "EuclideanContrastiveLoss",
    "HordeRegularizer", "LearnerRowNorm", "MarginLoss", "MultiSimilarityLoss", "Objective", "PMLLoss", "TripletLoss",
    "build_loss", "build_objective", "build_regularizer", "check_loss_options", "check_regularizer_options",
    "register_regularizer",
]

def check_loss_options(name: str, options: dict[str, Any] | None = None, miner: str | None = None,
                       miner_options: dict[str, Any] | None = None) -> None:
    """Metric loss ``name`` and its miner exist and take the options given (config validation)."""
    LOSSES.check(name, options)
    if miner is None:
        if miner_options:
            raise ConfigError("loss.miner_options are set but loss.miner is not "
                              "(e.g. loss.miner=pml:MultiSimilarityMiner)")
        return
    if not is_pml(name):
        raise ConfigError(f"loss.miner={miner} needs a pytorch-metric-learning loss (loss.name=pml:<Class>); the "
                          f"built-in '{name}' weighs every pair of the batch itself")
    MINERS.check(miner, miner_options)


def build_loss(name: str, options: dict[str, Any] | None = None, num_classes: int | None = None,
               embedding_size: int | None = None, miner: str | None = None,
               miner_options: dict[str, Any] | None = None) -> nn.Module:
    """Build metric loss ``name`` (the table in the module docstring, with its equation).

    Args:
        name: a name of ``LOSSES``.
        options: the loss's keyword options (``LOSSES.options(name)``); unknown ones are refused by name.
        num_classes: the training classes, for losses with per-class parameters (margin's per-class beta, PML's
            proxies and class weights).
        embedding_size: the width of the embeddings the loss sees (PML's proxy and classification losses).
        miner: a ``MINERS`` name (PML losses only), with its ``miner_options``.

    Returns:
        The loss module: ``loss(embeddings (B, D) l2-normalised, labels (B,)) -> scalar``.
    """
    check_loss_options(name, options, miner, miner_options)
    loss = LOSSES.build(name, options, num_classes=num_classes, embedding_size=embedding_size)
    if not is_pml(name):
        return loss
    return PMLLoss(loss, MINERS.build(miner, miner_options) if miner is not None else None)


def build_objective(config: Any, head: Head, num_classes: int | None = None) -> Objective:
    """The objective of a run: ``config`` is the ``loss`` section; unset choices take the head's defaults
    (``Head.metric_on``, ``Head.parts_reduction``, ``Head.default_regularizers``)."""
    on = config.on or head.metric_on
    reduction = config.parts_reduction or head.parts_reduction
    specs = config.regularizers if config.regularizers is not None else head.default_regularizers

    copies = head.num_parts if on == "parts" else 1

    def metric_loss() -> nn.Module:
        return build_loss(config.name, config.options, num_classes, embedding_size=head.embedding_dim // copies,
                          miner=config.miner, miner_options=config.miner_options)

    losses = [metric_loss() for _ in range(copies)]
    regularizers = {name: build_regularizer(name, options, head, num_classes, metric_loss)
                    for name, options in specs.items()}
    return Objective(losses, on=on, parts_reduction=reduction, regularizers=regularizers, num_classes=num_classes)
