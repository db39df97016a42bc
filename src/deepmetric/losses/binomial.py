"""Binomial deviance (Yi et al. 2014; Ustinova & Lempitsky 2016; thesis eq. 2.18 and §4.4.6).

Positive pairs: ``log(1 + exp(-alpha (s - beta)))``; negative pairs: ``log(1 + exp(alpha C (s - beta)))``
with alpha = 2, beta = 0.5, C = 25. Eq. 2.18 has no alpha on the positive term (``log(1 + e^{beta - s})``);
alpha there is Ustinova & Lempitsky's form and the authors' code's. Eq. 2.18 also omits C; the thesis' text
gives "negative weight C = 25" and the author's code puts C inside the exponent, as Ustinova & Lempitsky
define the cost, which is the default here (``cost="exponent"``); ``cost="weight"`` multiplies the negative
term by C instead. Reduction: for each anchor, the mean over its positives plus the mean over its negatives,
averaged over anchors (the code sums over anchors: the same loss times the batch size).

``positive_weight`` scales the positive term the same way. DGML's Table 1 prints the 25 on the positive
pairs (beta_1 = 25, beta_0 = 1: ``positive_weight=25, negative_weight=1``); its code, like the standard
form, puts it on the negatives (the default here).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from .pairs import masked_mean, similarity_and_masks
from .registry import LOSSES


@LOSSES.register("binomial")
class BinomialDevianceLoss(nn.Module):
    def __init__(self, alpha: float = 2.0, beta: float = 0.5, negative_weight: float = 25.0,
                 cost: str = "exponent", positive_weight: float = 1.0):
        super().__init__()
        if cost not in ("exponent", "weight"):
            raise ConfigError(f"binomial loss: cost must be 'exponent' or 'weight', got '{cost}'")
        self.alpha, self.beta, self.negative_weight, self.cost = alpha, beta, negative_weight, cost
        self.positive_weight = positive_weight

    def _scaled(self, logits: torch.Tensor, weight: float) -> torch.Tensor:
        """``log(1 + exp(C x))`` (cost in the exponent) or ``C log(1 + exp(x))``."""
        if self.cost == "exponent":
            return F.softplus(weight * logits)
        return weight * F.softplus(logits)

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor, ref_emb: torch.Tensor | None = None,
                ref_labels: torch.Tensor | None = None) -> torch.Tensor:
        sims, pos, neg = similarity_and_masks(embeddings, labels, ref_emb, ref_labels)
        positive = self._scaled(-self.alpha * (sims - self.beta), self.positive_weight)
        negative = self._scaled(self.alpha * (sims - self.beta), self.negative_weight)
        per_anchor = masked_mean(positive, pos, dim=1) + masked_mean(negative, neg, dim=1)
        return per_anchor.mean()
