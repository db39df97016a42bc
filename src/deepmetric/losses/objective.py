"""``Objective``: the weighted sum of the metric loss and the regularisers, each term logged by name.

The metric loss is ``loss(embeddings, labels) -> scalar``; a regulariser is
``reg(output: HeadOutput, labels) -> scalar``. The trainer calls ``objective(output, labels)`` and never
looks at which head, loss or regulariser it has.
"""

from __future__ import annotations

import torch
from torch import nn

from ..models.heads import HeadOutput


class Objective(nn.Module):
    def __init__(self, metric_loss: nn.Module, regularizers: dict[str, tuple[nn.Module, float]] | None = None):
        super().__init__()
        self.metric_loss = metric_loss
        self.regularizers = nn.ModuleDict({name: module for name, (module, _) in (regularizers or {}).items()})
        self.weights = {name: weight for name, (_, weight) in (regularizers or {}).items()}

    def forward(self, output: HeadOutput, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Return the total loss and its terms (unweighted), e.g. ``{"metric": ..., "divergence": ...}``."""
        terms = {"metric": self.metric_loss(output.embedding, labels)}
        total = terms["metric"]
        for name, regularizer in self.regularizers.items():
            terms[name] = regularizer(output, labels)
            total = total + self.weights[name] * terms[name]
        return total, terms
