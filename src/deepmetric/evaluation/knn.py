"""Exact k-nearest neighbours by cosine similarity, in blocks of queries, with deterministic ties.

Memory is bounded by ``block_rows x n_gallery`` similarities at a time (about ``memory_mb``), so an
SOP-sized set (60,502 x 60,502) never materialises its full similarity matrix. Neighbours are ordered
by decreasing similarity and, among exactly equal similarities, by increasing gallery index, so the
result (and every metric computed from it) does not depend on the block size or the hardware.
A query's own gallery row (``self_index``) is removed by index, never by position.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


def block_rows_for(n_gallery: int, memory_mb: float = 256.0) -> int:
    """Queries per block so that one block of float32 similarities stays near ``memory_mb``."""
    return max(1, int(memory_mb * 2**20 / (4 * max(n_gallery, 1) * 3)))


def topk_stable(sims: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise top-``k`` of ``sims`` ordered by (similarity desc, index asc), exact under ties."""
    values, indices = sims.topk(k, dim=1)
    kth = values[:, -1:]
    need = k - (sims > kth).sum(dim=1)
    straddling = (sims == kth).sum(dim=1) > need  # ties cross the k boundary: topk chose arbitrarily
    if straddling.any():
        rows = straddling.nonzero().squeeze(1)
        order = torch.sort(sims[rows], dim=1, descending=True, stable=True).indices[:, :k]
        indices[rows] = order
        values[rows] = sims[rows].gather(1, order)
    by_index, perm = indices.sort(dim=1)
    values = values.gather(1, perm)
    order = torch.sort(values, dim=1, descending=True, stable=True).indices
    return values.gather(1, order), by_index.gather(1, order)


def iter_knn(query: torch.Tensor, gallery: torch.Tensor, k: int, self_index: torch.Tensor | None = None,
             memory_mb: float = 256.0) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """Yield ``(first query row, similarities (b, k), gallery indices (b, k))`` block by block.

    ``query`` and ``gallery`` are l2-normalised (n, D) tensors; ``self_index[i]`` is the gallery row of
    query i (or -1), which is excluded from its neighbours.
    """
    n_gallery = gallery.shape[0]
    block = block_rows_for(n_gallery, memory_mb)
    for start in range(0, query.shape[0], block):
        sims = query[start:start + block] @ gallery.t()
        if self_index is not None:
            own = self_index[start:start + block]
            rows = torch.nonzero(own >= 0).squeeze(1)
            sims[rows, own[rows]] = float("-inf")
        values, indices = topk_stable(sims, k)
        yield start, values, indices


def knn(query: torch.Tensor, gallery: torch.Tensor, k: int, self_index: torch.Tensor | None = None,
        memory_mb: float = 256.0) -> tuple[torch.Tensor, torch.Tensor]:
    """All neighbours at once: similarities and indices, each (n_query, k)."""
    parts = list(iter_knn(query, gallery, k, self_index, memory_mb))
    return torch.cat([p[1] for p in parts]), torch.cat([p[2] for p in parts])
