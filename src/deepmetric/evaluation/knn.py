"""Exact k-nearest neighbours by cosine similarity, in blocks of queries, with deterministic ties.

Memory is bounded by ``block_rows x n_gallery`` similarities at a time (about ``memory_mb``), so an
SOP-sized set (60,502 x 60,502) never materialises its full similarity matrix. Neighbours are ordered
by decreasing similarity and, among exactly equal similarities, by increasing gallery index, so the
result (and every metric computed from it) does not depend on the block size, the engine or the hardware.
A query's own gallery row (``self_index``) is removed by index, never by position.

Two engines give the same neighbours:

- ``torch``: a block of similarities by one matrix product, then the top-k;
- ``faiss`` (when installed): faiss' exact inner-product search proposes ``k + margin`` candidates, whose
  similarities are recomputed with the same torch product and sorted by the rule above; a row whose
  candidates might not contain the true top-k (ties reaching the end of the candidate list) is
  recomputed by the torch engine.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from ..errors import DeepMetricError

FAISS_MARGIN = 16


def faiss_available() -> bool:
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_engine(engine: str) -> str:
    if engine == "auto":
        return "faiss" if faiss_available() else "torch"
    if engine not in ("torch", "faiss"):
        raise DeepMetricError(f"kNN engine must be auto, torch or faiss, got '{engine}'")
    if engine == "faiss" and not faiss_available():
        raise DeepMetricError("kNN engine 'faiss' asked for, but faiss is not installed (pip install faiss-cpu)")
    return engine


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
    return sort_candidates(values, indices)


def sort_candidates(values: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Order each row's candidates by (similarity desc, index asc)."""
    by_index, perm = indices.sort(dim=1)
    values = values.gather(1, perm)
    order = torch.sort(values, dim=1, descending=True, stable=True).indices
    return values.gather(1, order), by_index.gather(1, order)


def _torch_block(query: torch.Tensor, gallery: torch.Tensor, k: int,
                 own: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    sims = query @ gallery.t()
    if own is not None:
        rows = torch.nonzero(own >= 0).squeeze(1)
        sims[rows, own[rows]] = float("-inf")
    return topk_stable(sims, k)


class _FaissSearcher:
    """faiss candidates, re-scored with torch so that both engines rank identically."""

    def __init__(self, gallery: torch.Tensor):
        import faiss

        self.gallery = gallery
        self.index = faiss.IndexFlatIP(gallery.shape[1])
        self.index.add(np.ascontiguousarray(gallery.numpy(), dtype=np.float32))

    def rescore(self, query: torch.Tensor, candidates: torch.Tensor, memory_mb: float = 32.0) -> torch.Tensor:
        """Similarities of each query to its candidates, by the same float32 dot products as the torch engine,
        a few rows at a time (the gathered gallery rows are rows x width x D floats)."""
        width, dim = candidates.shape[1], self.gallery.shape[1]
        rows = max(1, int(memory_mb * 2**20 / (4 * width * dim)))
        exact = torch.empty(candidates.shape)
        for s in range(0, len(candidates), rows):
            chosen = self.gallery[candidates[s:s + rows].clamp_min(0)]  # (r, width, D)
            exact[s:s + rows] = torch.einsum("rd,rwd->rw", query[s:s + rows], chosen)
        exact[candidates < 0] = float("-inf")
        return exact

    def block(self, query: torch.Tensor, k: int, own: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.gallery.shape[0]
        width = min(n, k + FAISS_MARGIN + (1 if own is not None else 0))
        scores, found = self.index.search(np.ascontiguousarray(query.numpy(), dtype=np.float32), width)
        candidates = torch.from_numpy(found).long()  # (b, width)
        exact = self.rescore(query, candidates)
        if own is not None:
            exact[candidates == own[:, None]] = float("-inf")
        values, indices = sort_candidates(exact, candidates)
        if width == n:
            return values[:, :k], indices[:, :k]
        # The candidates hold the true top-k unless something left out could tie or beat the k-th: faiss
        # scored everything it left out at most as high as its last candidate, so demand a gap over that.
        left_out_bound = torch.from_numpy(scores[:, -1]).float()
        unsure = values[:, k - 1] <= left_out_bound + 1e-5
        values, indices = values[:, :k].clone(), indices[:, :k].clone()
        if unsure.any():
            rows = unsure.nonzero().squeeze(1)
            fixed = _torch_block(query[rows], self.gallery, k, None if own is None else own[rows])
            values[rows], indices[rows] = fixed
        return values, indices


def iter_knn(query: torch.Tensor, gallery: torch.Tensor, k: int, self_index: torch.Tensor | None = None,
             memory_mb: float = 256.0, engine: str = "torch") -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """Yield ``(first query row, similarities (b, k), gallery indices (b, k))`` block by block.

    ``query`` and ``gallery`` are l2-normalised (n, D) float32 CPU tensors; ``self_index[i]`` is the gallery
    row of query i (or -1), which is excluded from its neighbours.
    """
    engine = resolve_engine(engine)
    block = block_rows_for(gallery.shape[0], memory_mb)
    searcher = _FaissSearcher(gallery) if engine == "faiss" else None
    for start in range(0, query.shape[0], block):
        q = query[start:start + block]
        own = None if self_index is None else self_index[start:start + block]
        values, indices = searcher.block(q, k, own) if searcher else _torch_block(q, gallery, k, own)
        yield start, values, indices


def knn(query: torch.Tensor, gallery: torch.Tensor, k: int, self_index: torch.Tensor | None = None,
        memory_mb: float = 256.0, engine: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
    """All neighbours at once: similarities and indices, each (n_query, k)."""
    parts = list(iter_knn(query, gallery, k, self_index, memory_mb, engine))
    return torch.cat([p[1] for p in parts]), torch.cat([p[2] for p in parts])
