"""α-weighted query expansion (αQE) and database-side augmentation (DBA) (Radenović, Tolias and Chum, TPAMI 2018,
"Fine-tuning CNN Image Retrieval with No Human Annotation"; DBA after Arandjelović and Zisserman, CVPR 2012).

αQE replaces a query q by ``normalise(q + Σ_{i<=n} w_i x_i)`` over its n nearest gallery items x_i (the exact kNN:
by decreasing similarity, ties by index, its own gallery row left out), ``w_i = max(s(q, x_i), 0)^α``: the query
itself enters with weight 1 = s(q, q)^α, as the paper's weighted average of the query and its top-ranked images.
α = 0 weighs every neighbour 1 (average query expansion). DBA does the same to every gallery item over its n
nearest other gallery items. With both, the gallery is augmented first and the queries are expanded against the
augmented gallery. The ranking is then the exact kNN of the new vectors.

Decisions the paper leaves open: a negative similarity weighs 0 (a real power of a negative number is undefined);
only the gallery is augmented (a query is a new image, also in single-set retrieval, where the queries are the
gallery's items: they keep their own embedding and are expanded against the augmented gallery); the sums are
float32, as the embeddings.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .knn import knn
from .rerank import QueryExpansion, check_items


def expand(x: torch.Tensor, gallery: torch.Tensor, n: int, alpha: float, self_index: torch.Tensor | None = None,
           memory_mb: float = 256.0, engine: str = "auto") -> torch.Tensor:
    """Each l2-normalised row of ``x`` (b, D) as ``normalise(x + Σ_{i<=n} max(s_i, 0)^α g_i)`` over its ``n`` nearest
    rows of ``gallery`` (``self_index[i]``: row i's own gallery row, left out; or -1)."""
    searchable = gallery.shape[0] - (1 if self_index is not None and bool((self_index >= 0).any()) else 0)
    n = min(n, searchable)
    if n <= 0:
        return x.clone()
    sims, indices = knn(x, gallery, n, self_index, memory_mb, engine)  # (b, n)
    weights = sims.clamp_min(0).pow(alpha)
    out = torch.empty_like(x)
    rows = max(1, int(32 * 2**20 / (4 * n * x.shape[1])))  # gathered neighbours: rows x n x D floats
    for start in range(0, x.shape[0], rows):
        stop = start + rows
        added = torch.einsum("bn,bnd->bd", weights[start:stop], gallery[indices[start:stop]])
        out[start:stop] = F.normalize(x[start:stop] + added, dim=1)
    return out


def expanded_embeddings(query: torch.Tensor, gallery: torch.Tensor, self_index: torch.Tensor | None,
                        settings: QueryExpansion, memory_mb: float = 256.0, engine: str = "auto",
                        search: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(queries, gallery)`` after DBA (``settings.dba_n``) then αQE (``settings.qe_n``); ``search``: the bound on
    DBA's gallery is a search's (``rerank.check_items``)."""
    if settings.dba_n:
        check_items(settings, gallery.shape[0], "gallery items", search)
        gallery = expand(gallery, gallery, settings.dba_n, settings.alpha, torch.arange(gallery.shape[0]), memory_mb,
                         engine)
    if settings.qe_n:
        query = expand(query, gallery, settings.qe_n, settings.alpha, self_index, memory_mb, engine)
    return query, gallery
