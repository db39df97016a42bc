"""Margin loss (Wu et al. 2017, "Sampling matters in deep embedding learning") on all pairs of the batch.

With the Euclidean distance of unit vectors ``d = sqrt(2 - 2 s)`` (thesis eq. 2.11):
positives ``max(0, alpha + d - beta)``, negatives ``max(0, alpha + beta - d)``, summed over all pairs and
divided by the number of active (non-zero) pairs; alpha = 0.2, beta initialised at 1.2 and learned,
either one boundary or one per class (``per_class``, indexed by the contiguous training label), with
an optional ``nu * beta`` regulariser. The boundary is a parameter of the loss: the trainer optimises
it in its own parameter group (``train.lr_loss``). Distance-weighted sampling is not applied: all
pairs are used, like the other losses here.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ConfigError
from .pairs import similarity_and_masks
from .registry import LOSSES


@LOSSES.register("margin")
class MarginLoss(nn.Module):
    def __init__(self, margin: float = 0.2, beta: float = 1.2, learn_beta: bool = True, per_class: bool = False,
                 nu: float = 0.0, num_classes: int | None = None):
        super().__init__()
        if per_class and not num_classes:
            raise ConfigError("margin loss: per_class=true needs the number of training classes")
        self.margin, self.nu, self.per_class = margin, nu, per_class
        size = num_classes if per_class and num_classes else 1  # (per_class without num_classes was refused)
        self.beta = nn.Parameter(torch.full((size,), float(beta)), requires_grad=learn_beta)

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor, ref_emb: torch.Tensor | None = None,
                ref_labels: torch.Tensor | None = None) -> torch.Tensor:
        sims, pos, neg = similarity_and_masks(embeddings, labels, ref_emb, ref_labels)
        distances = torch.sqrt((2.0 - 2.0 * sims).clamp_min(1e-12))
        beta = self.beta[labels][:, None] if self.per_class else self.beta  # boundary of the anchor's class
        pos_loss = torch.relu(self.margin + distances - beta) * pos
        neg_loss = torch.relu(self.margin + beta - distances) * neg
        active = ((pos_loss > 0).sum() + (neg_loss > 0).sum()).clamp_min(1)
        loss = (pos_loss.sum() + neg_loss.sum()) / active
        if self.nu:
            used = self.beta[labels] if self.per_class else self.beta
            loss = loss + self.nu * used.mean()
        return loss
