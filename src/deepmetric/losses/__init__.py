"""Metric losses on cosine similarities of l2-normalised embeddings, over all pairs/triplets of a batch.

| name | loss | defaults |
|---|---|---|
| ``contrastive`` | thesis eq. 2.12 | margin 0.5 |
| ``contrastive-euclidean`` | ABE eq. 10 (Euclidean distance) | margin 1 |
| ``triplet`` | thesis eq. 2.14 | margin 0.1 |
| ``binomial`` | binomial deviance, eq. 2.18 | alpha 2, beta 0.5, negative_weight 25 |
| ``multi-similarity`` | Wang et al. 2019, eq. 2.20 | alpha 2, beta 50, base 0.5, mining |
| ``margin`` | Wu et al. 2017 | margin 0.2, beta 1.2 (learned) |

Regularisers (``loss.regularizers.<name>``): ``diversity`` (DGML eq. 4, ``diversity.py``), ``horde``
(``horde.py``, thesis ch. 5).
"""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn

from ..errors import ConfigError, did_you_mean
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
from .regularizers import REGULARIZERS, build_regularizer, check_regularizer_options, register_regularizer
from .triplet import TripletLoss

register_regularizer("horde", HordeRegularizer)

LOSSES: dict[str, type[nn.Module]] = {
    "contrastive": ContrastiveLoss,
    "contrastive-euclidean": EuclideanContrastiveLoss,
    "triplet": TripletLoss,
    "binomial": BinomialDevianceLoss,
    "multi-similarity": MultiSimilarityLoss,
    "margin": MarginLoss,
}

register_regularizer("divergence", ABEDivergenceLoss)
register_regularizer("diversity", DiversityLoss)
register_regularizer("deml-adversary", DeMLAdversary)
register_regularizer("deml-hinge", DeMLPairHinge)
register_regularizer("activation-decay", ActivationDecay)
register_regularizer("learner-row-norm", LearnerRowNorm)

__all__ = [
    "LOSSES", "REGULARIZERS", "ABEDivergenceLoss", "ActivationDecay", "BinomialDevianceLoss", "ContrastiveLoss",
    "DeMLAdversary", "DeMLPairHinge", "DiversityLoss", "EuclideanContrastiveLoss", "HordeRegularizer", "LearnerRowNorm",
    "MarginLoss", "MultiSimilarityLoss", "Objective", "TripletLoss", "build_loss", "build_objective",
    "build_regularizer", "check_loss_options", "check_regularizer_options", "register_regularizer",
]


def check_loss_options(name: str, options: dict[str, Any] | None) -> type[nn.Module]:
    """The class of metric loss ``name``; an unknown name or option is named with the valid ones."""
    if name not in LOSSES:
        raise ConfigError(f"unknown loss '{name}'{did_you_mean(name, LOSSES)}; expected one of {', '.join(LOSSES)}")
    cls = LOSSES[name]
    accepted = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "num_classes")]
    for key in options or {}:
        if key not in accepted:
            raise ConfigError(f"loss '{name}' has no option '{key}'{did_you_mean(key, accepted)}; its options are: "
                              f"{', '.join(accepted)}")
    return cls


def build_loss(name: str, options: dict[str, Any] | None = None, num_classes: int | None = None) -> nn.Module:
    """Build metric loss ``name``; ``num_classes`` reaches the losses that keep per-class parameters."""
    cls = check_loss_options(name, options)
    options = dict(options or {})
    if "num_classes" in inspect.signature(cls.__init__).parameters:
        options["num_classes"] = num_classes
    try:
        return cls(**options)
    except TypeError as error:
        raise ConfigError(f"loss '{name}': {error}") from None


def build_objective(config: Any, head: nn.Module, num_classes: int | None = None) -> Objective:
    """The objective of a run: ``config`` is the ``loss`` section; unset choices take the head's defaults
    (``Head.metric_on``, ``Head.parts_reduction``, ``Head.default_regularizers``)."""
    on = config.on or getattr(head, "metric_on", "embedding")
    reduction = config.parts_reduction or getattr(head, "parts_reduction", "mean")
    copies = getattr(head, "num_parts", 1) if on == "parts" else 1
    losses = [build_loss(config.name, config.options, num_classes) for _ in range(copies)]
    specs = config.regularizers if config.regularizers is not None else getattr(head, "default_regularizers", {})

    def metric_loss() -> nn.Module:
        return build_loss(config.name, config.options, num_classes)

    regularizers = {name: build_regularizer(name, options, head, num_classes, metric_loss)
                    for name, options in specs.items()}
    return Objective(losses, on=on, parts_reduction=reduction, regularizers=regularizers, num_classes=num_classes)
