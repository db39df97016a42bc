"""Multi-similarity loss (Wang et al. 2019; thesis eq. 2.20), with the paper's optional pair mining.

For anchor q: ``(1/alpha) log(1 + sum_p exp(-alpha (s_qp - lambda)))``
``+ (1/beta) log(1 + sum_n exp(beta (s_qn - lambda)))``,
averaged over anchors; alpha = 2, beta = 50, lambda = 0.5 (the authors' defaults). The names are Wang et al.'s:
eq. 2.20 writes the same loss with gamma for the negatives' sharpness (our beta = 50) and beta for the
margin (our lambda = 0.5). With ``mining``,
only the informative pairs enter the sums: negatives with ``s_qn > min_p s_qp - epsilon`` and positives
with ``s_qp < max_n s_qn + epsilon`` (epsilon = 0.1).
"""

from __future__ import annotations

import torch
from torch import nn

from .pairs import similarity_and_masks
from .registry import LOSSES


def _log1p_sum_exp(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Row-wise ``log(1 + sum_{mask} exp(values))``, computed stably."""
    masked = values.masked_fill(~mask, float("-inf"))
    zeros = torch.zeros(values.shape[0], 1, dtype=values.dtype, device=values.device)
    return torch.logsumexp(torch.cat([zeros, masked], dim=1), dim=1)


@LOSSES.register("multi-similarity")
class MultiSimilarityLoss(nn.Module):
    def __init__(self, alpha: float = 2.0, beta: float = 50.0, base: float = 0.5, mining: bool = True,
                 epsilon: float = 0.1):
        super().__init__()
        self.alpha, self.beta, self.base, self.mining, self.epsilon = alpha, beta, base, mining, epsilon

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor, ref_emb: torch.Tensor | None = None,
                ref_labels: torch.Tensor | None = None) -> torch.Tensor:
        sims, pos, neg = similarity_and_masks(embeddings, labels, ref_emb, ref_labels)
        if self.mining:
            with torch.no_grad():
                hardest_pos = sims.masked_fill(~pos, float("inf")).min(dim=1, keepdim=True).values
                hardest_neg = sims.masked_fill(~neg, float("-inf")).max(dim=1, keepdim=True).values
            neg = neg & (sims + self.epsilon > hardest_pos)
            pos = pos & (sims - self.epsilon < hardest_neg)
        positive = _log1p_sum_exp(-self.alpha * (sims - self.base), pos) / self.alpha
        negative = _log1p_sum_exp(self.beta * (sims - self.base), neg) / self.beta
        return (positive + negative).mean()
