"""Shared pieces of the pair-based losses: the cosine similarity matrix and the pair masks."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def similarity_and_masks(embeddings: torch.Tensor, labels: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cosine similarities (B, B) and the positive / negative pair masks (self-pairs excluded).

    Embeddings are re-normalised (a no-op for a head's l2-normalised output), so ``s`` is the cosine
    similarity of eq. 2.13 in the thesis.
    """
    unit = F.normalize(embeddings, dim=1)
    sims = unit @ unit.t()
    same = labels[:, None] == labels[None, :]
    eye = torch.eye(len(labels), dtype=torch.bool, device=labels.device)
    return sims, same & ~eye, ~same


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` where ``mask``; 0 where the mask is empty (instead of NaN)."""
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp_min(1.0)
    return (values * mask).sum(dim) / mask.sum(dim).clamp_min(1.0)
