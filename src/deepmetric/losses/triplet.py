"""Triplet loss on cosine similarity over all triplets of the batch (thesis eq. 2.14; alpha = 0.1).

``L = max(0, s(x_q, x_n) - s(x_q, x_p) + alpha)`` for every anchor q, positive p != q and negative n,
averaged over the active (non-zero) triplets, as in the authors' code and pytorch-metric-learning's
``TripletMarginLoss(triplets_per_anchor="all")`` with its default reducer.
"""

from __future__ import annotations

import torch
from torch import nn

from .pairs import masked_mean, similarity_and_masks


class TripletLoss(nn.Module):
    def __init__(self, margin: float = 0.1):
        super().__init__()
        self.margin = margin

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        sims, pos, neg = similarity_and_masks(embeddings, labels)
        # (q, p, n): s_qn - s_qp + alpha, valid where p is a positive and n a negative of q
        losses = torch.relu(sims[:, None, :] - sims[:, :, None] + self.margin)
        valid = pos[:, :, None] & neg[:, None, :]
        return masked_mean(losses, valid & (losses > 0))
