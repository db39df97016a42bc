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

Every metric loss takes an optional reference set, ``loss(embeddings, labels, ref_emb, ref_labels)``: the batch's
rows are then paired with the reference's instead of with each other (``pairs.py``); a cross-batch memory
(``loss.memory``, ``memory.py``) uses it. Regularisers (``loss.regularizers.<name>``) have their own table in
``regularizers.py``.
"""

from __future__ import annotations

# The built-ins register themselves in this order, the order LOSSES and REGULARIZERS list them.
# isort: off
from . import contrastive, triplet, binomial, multi_similarity, margin, pml  # noqa: F401
from . import horde, divergence, diversity, deml_diversity, activation_decay  # noqa: F401
# isort: on
from .activation_decay import ActivationDecay, LearnerRowNorm
from .binomial import BinomialDevianceLoss
from .build import (
    build_loss,
    build_objective,
    check_loss_options,
    check_memory_loss,
    check_objective,
    create_objective,
    try_loss,
)
from .contrastive import ContrastiveLoss, EuclideanContrastiveLoss
from .deml_diversity import DeMLAdversary, DeMLPairHinge
from .divergence import ABEDivergenceLoss
from .diversity import DiversityLoss
from .horde import HordeRegularizer
from .margin import MarginLoss
from .memory import CrossBatchMemory
from .multi_similarity import MultiSimilarityLoss
from .objective import Objective
from .pml import PMLLoss
from .registry import LOSSES, MINERS, REGULARIZERS
from .regularizers import build_regularizer, check_regularizer_options, register_regularizer, regularizer_options
from .triplet import TripletLoss

__all__ = [
    "LOSSES", "MINERS", "REGULARIZERS", "ABEDivergenceLoss", "ActivationDecay", "BinomialDevianceLoss",
    "ContrastiveLoss", "CrossBatchMemory", "DeMLAdversary", "DeMLPairHinge", "DiversityLoss",
    "EuclideanContrastiveLoss", "HordeRegularizer", "LearnerRowNorm", "MarginLoss", "MultiSimilarityLoss", "Objective",
    "PMLLoss", "TripletLoss",
    "build_loss", "build_objective", "build_regularizer", "check_loss_options", "check_objective", "create_objective",
    "check_memory_loss", "check_regularizer_options", "try_loss",
    "register_regularizer", "regularizer_options",
]
