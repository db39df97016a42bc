"""Shared pieces of the pair-based losses: the cosine similarity matrix and the pair masks.

Every pair-based loss is ``loss(embeddings, labels, ref_emb=None, ref_labels=None)``: without a reference set the
pairs are those of the batch (``B x B``, self-pairs left out); with one, each query row of the batch is paired with
every row of the reference set (``B x R``), e.g. a cross-batch memory (``memory.py``). The reference rows are never
the queries themselves (the memory holds earlier batches only), so no pair is left out there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def check_reference(embeddings: torch.Tensor, ref_emb: torch.Tensor | None,
                    ref_labels: torch.Tensor | None) -> None:
    """``ref_emb`` and ``ref_labels`` come together, one label per reference row, as wide as the queries."""
    if (ref_emb is None) != (ref_labels is None):
        raise ValueError("ref_emb and ref_labels go together: give both or neither")
    if ref_emb is not None and ref_labels is not None and (ref_emb.dim() != 2 or ref_emb.shape[1] != embeddings.shape[1]
                                or len(ref_labels) != len(ref_emb)):
        raise ValueError(f"the reference set is {tuple(ref_emb.shape)} with {len(ref_labels)} labels; expected "
                         f"(R, {embeddings.shape[1]}) with R labels")


def similarity_and_masks(embeddings: torch.Tensor, labels: torch.Tensor, ref_emb: torch.Tensor | None = None,
                         ref_labels: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cosine similarities of the queries with the references, (B, B) or (B, R), and the positive / negative pair
    masks: within the batch (no reference) self-pairs are excluded; against a reference set every pair counts.

    Embeddings are re-normalised (a no-op for a head's l2-normalised output), so ``s`` is the cosine
    similarity of eq. 2.13 in the thesis.
    """
    check_reference(embeddings, ref_emb, ref_labels)
    unit = F.normalize(embeddings, dim=1)
    if ref_emb is not None and ref_labels is not None:  # (check_reference: both or neither)
        same = labels[:, None] == ref_labels[None, :]
        return unit @ F.normalize(ref_emb, dim=1).t(), same, ~same
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
