"""Triplet loss on cosine similarity over all triplets of the batch (thesis eq. 2.14; alpha = 0.1).

``L = max(0, s(x_q, x_n) - s(x_q, x_p) + alpha)`` for every anchor q, positive p != q and negative n,
averaged over the active (non-zero) triplets, as in the authors' code and pytorch-metric-learning's
``TripletMarginLoss(triplets_per_anchor="all")`` with its default reducer.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .pairs import masked_mean, similarity_and_masks
from .registry import LOSSES

TRIPLETS_AT_ONCE = 2**24
"""Most (anchor, positive, negative) entries computed at once: against a memory of R rows the B x R x R cube is cut
into groups of anchors (a batch of 64 against 4,096 rows would be 1.1 G entries)."""


@LOSSES.register("triplet")
class TripletLoss(nn.Module):
    def __init__(self, margin: float = 0.1):
        super().__init__()
        self.margin = margin

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor, ref_emb: torch.Tensor | None = None,
                ref_labels: torch.Tensor | None = None) -> torch.Tensor:
        sims, pos, neg = similarity_and_masks(embeddings, labels, ref_emb, ref_labels)
        if sims.numel() * sims.shape[1] <= TRIPLETS_AT_ONCE:
            losses, valid = self._triplets(sims, pos, neg)
            return masked_mean(losses, valid & (losses > 0))
        # a large reference set (a cross-batch memory): the same sums, a few anchors at a time, each group's cube
        # recomputed in the backward pass instead of kept (torch.utils.checkpoint)
        total, count = sims.new_zeros(()), sims.new_zeros(())
        step = max(1, TRIPLETS_AT_ONCE // (sims.shape[1] ** 2))
        for start in range(0, len(sims), step):
            rows = slice(start, start + step)
            part_total, part_count = checkpoint(self._active_sum, sims[rows], pos[rows], neg[rows],
                                                use_reentrant=False)
            total, count = total + part_total, count + part_count
        return total / count.clamp_min(1.0)

    def _active_sum(self, sims: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The sum and the number of the active triplets of these anchors."""
        losses, valid = self._triplets(sims, pos, neg)
        active = valid & (losses > 0)
        return losses.masked_fill(~active, 0.0).sum(), active.sum().to(losses.dtype)

    def _triplets(self, sims: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        # (q, p, n): s_qn - s_qp + alpha, valid where p is a positive and n a negative of q
        losses = torch.relu(sims[:, None, :] - sims[:, :, None] + self.margin)
        return losses, pos[:, :, None] & neg[:, None, :]
