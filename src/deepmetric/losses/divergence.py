"""ABE's divergence loss (Kim et al. 2018, eq. 9): learners must embed the same image differently.

``L_div = sum_i sum_{p<q} max(0, m_div - ||B_p(x_i) - B_q(x_i)||^2)`` over the "self pairs" (two learners'
embeddings of one image), m_div = 1; on unit vectors ||a - b||^2 = 2 - 2 cos, so the hinge is active while
two learners' cosine exceeds 1 - m_div/2 = 0.5. The paper writes plain sums; the default ``reduction="mean"``
averages over images and unordered learner pairs, which keeps the term in [0, m_div] whatever the batch size
and M, comparable with the metric loss at lambda_div = 1; ``reduction="sum"`` is the paper's literal form.
(The HORDE authors' re-implementation instead penalises pairs of learners across different images too; that
departs from the paper's self pairs and is not reproduced.)
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ConfigError
from ..models.heads import HeadOutput
from .registry import REGULARIZERS


@REGULARIZERS.register("divergence")  # ABE eq. 9
class ABEDivergenceLoss(nn.Module):
    def __init__(self, margin: float = 1.0, reduction: str = "mean"):
        super().__init__()
        if reduction not in ("mean", "sum"):
            raise ConfigError(f"divergence: reduction must be 'mean' or 'sum', got '{reduction}'")
        self.margin, self.reduction = margin, reduction

    def forward(self, output: HeadOutput, labels: torch.Tensor) -> torch.Tensor:
        parts = torch.stack(output.parts, dim=1)  # (B, M, d)
        m = parts.shape[1]
        if m < 2:
            return parts.new_zeros(())
        p, q = torch.triu_indices(m, m, offset=1, device=parts.device)
        squared = (parts[:, p] - parts[:, q]).pow(2).sum(dim=2)  # (B, M(M-1)/2)
        hinge = torch.relu(self.margin - squared)
        return hinge.mean() if self.reduction == "mean" else hinge.sum()
