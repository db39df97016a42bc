"""Contrastive loss, cosine form (thesis eq. 2.12; DIABLO §4.4.6: beta = 0.5).

``L = delta_xy (1 - s)^2 + (1 - delta_xy) max(0, s - beta)``. Reduction as in the authors' code
(``kerastools/losses/dml_loss.py``): the positive term is averaged over all positive pairs, the negative
term over the *active* negative pairs (``s > beta``), and each is halved.
"""

from __future__ import annotations

import torch
from torch import nn

from .pairs import masked_mean, similarity_and_masks


class ContrastiveLoss(nn.Module):
    def __init__(self, margin: float = 0.5):
        super().__init__()
        self.margin = margin

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        sims, pos, neg = similarity_and_masks(embeddings, labels)
        positive = masked_mean((1.0 - sims) ** 2, pos)
        hinge = torch.relu(sims - self.margin)
        negative = masked_mean(hinge, neg & (hinge > 0))
        return 0.5 * positive + 0.5 * negative
