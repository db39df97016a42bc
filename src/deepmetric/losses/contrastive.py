"""Contrastive loss, cosine form (thesis eq. 2.12; DIABLO §4.4.6: beta = 0.5).

``L = delta_xy (1 - s)^2 + (1 - delta_xy) max(0, s - beta)``. Reduction as in the authors' code
(``kerastools/losses/dml_loss.py``): the positive term is averaged over all positive pairs, the negative
term over the *active* negative pairs (``s > beta``), and each is halved.
"""

from __future__ import annotations

import torch
from torch import nn

from .pairs import masked_mean, similarity_and_masks
from .registry import LOSSES


@LOSSES.register("contrastive-euclidean")
class EuclideanContrastiveLoss(nn.Module):
    """Contrastive loss in the Euclidean form of ABE (Kim et al. 2018, eq. 10), margin m_c = 1.

    ``L = mean_{i != j} [ y_ij D_ij^2 + (1 - y_ij) [m_c - D_ij]_+ ]`` with ``D = ||x_i - x_j|| = sqrt(2 - 2 s)``
    on unit vectors, as printed in the paper (unsquared hinge); ``squared_hinge=True`` uses ``[m_c - D]_+^2``,
    Caffe's ContrastiveLoss layer, which the paper's implementation probably used. All ordered pairs of
    the batch (or all query-reference pairs), averaged. ``unit=False`` measures D on the raw embeddings instead of
    the unit vectors (for an unnormalised latent space, e.g. MIRAGE's 2-D picture, thesis Fig. 6.3b).
    """

    def __init__(self, margin: float = 1.0, squared_hinge: bool = False, unit: bool = True):
        super().__init__()
        self.margin, self.squared_hinge, self.unit = margin, squared_hinge, unit

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor, ref_emb: torch.Tensor | None = None,
                ref_labels: torch.Tensor | None = None) -> torch.Tensor:
        sims, pos, neg = similarity_and_masks(embeddings, labels, ref_emb, ref_labels)
        if self.unit:
            squared = (2.0 - 2.0 * sims).clamp_min(0.0)
        else:
            others = embeddings if ref_emb is None else ref_emb
            squared = (embeddings[:, None, :] - others[None, :, :]).pow(2).sum(-1)
        hinge = torch.relu(self.margin - torch.sqrt(squared.clamp_min(1e-12)))
        if self.squared_hinge:
            hinge = hinge.pow(2)
        return masked_mean(torch.where(pos, squared, hinge), pos | neg)


@LOSSES.register("contrastive")
class ContrastiveLoss(nn.Module):
    def __init__(self, margin: float = 0.5):
        super().__init__()
        self.margin = margin

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor, ref_emb: torch.Tensor | None = None,
                ref_labels: torch.Tensor | None = None) -> torch.Tensor:
        sims, pos, neg = similarity_and_masks(embeddings, labels, ref_emb, ref_labels)
        positive = masked_mean((1.0 - sims) ** 2, pos)
        hinge = torch.relu(sims - self.margin)
        negative = masked_mean(hinge, neg & (hinge > 0))
        return 0.5 * positive + 0.5 * negative
