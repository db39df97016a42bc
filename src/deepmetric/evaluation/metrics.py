"""Retrieval metrics: Recall@K, MAP@R, R-precision and NMI.

Definitions (each query is ranked against the gallery by cosine similarity, its own row excluded; a
query whose class has no other gallery item is left out of every metric, as pytorch-metric-learning
does, and reported):

- **Recall@K** (the DML sense, thesis §2.6.2): the fraction of queries with at least one item of their
  class among their K nearest neighbours.
- **R-precision**: with R the number of gallery items of the query's class, the fraction of the top R
  that are of that class.
- **MAP@R** (Musgrave et al. 2020): ``(1/R) sum_{i=1..R} P(i) rel(i)``, the average precision cut at R,
  where P(i) is the precision of the top i and rel(i) says whether item i is of the query's class.
- **NMI**: k-means of the query embeddings with as many clusters as query classes, compared with the
  labels by ``2 I(Y; C) / (H(Y) + H(C))`` (scikit-learn, arithmetic normalisation). On a query/gallery
  protocol (In-Shop, a CSV with ``is_query``/``is_gallery``) it clusters the queries alone: NMI measures
  clustering, which has no gallery. It is undefined, and None (``null`` in JSON, ``—`` in tables), when the
  queries hold fewer than 2 classes or every query is its own class. NMI depends on the
  k-means used (the thesis saw 5 points between two variants): scikit-learn's below 100 classes,
  faiss' from 100 on when installed (``FAISS_KMEANS_FROM``); with the ``cuda`` engine, faiss' k-means written in
  torch on the GPU (``kmeans.py``: the same start and steps, so the same clustering up to rounding).

Ties between exactly equal similarities are broken by gallery index (see ``knn.py``).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import DeepMetricError
from ..progress import progress_bar
from .kmeans import kmeans_faiss_rule
from .knn import faiss_available, iter_knn, resolve_engine
from .rerank import Rerank, as_rerank, reranked_knn

log = logging.getLogger(__name__)


def _dtype_kind(array: np.ndarray | torch.Tensor) -> str:
    """numpy's dtype kind of ``array`` (``f`` float, ``i``/``u`` integer, ``b`` bool, ``c`` complex, ``U`` text …)."""
    if isinstance(array, torch.Tensor):
        dtype = array.dtype
        return "c" if dtype.is_complex else "f" if dtype.is_floating_point else "b" if dtype == torch.bool else "i"
    return np.asarray(array).dtype.kind


def _as_tensor(array: np.ndarray | torch.Tensor, name: str) -> torch.Tensor:
    if _dtype_kind(array) not in "iuf":  # text, complex numbers, booleans, objects: no embedding
        raise DeepMetricError(f"{name} must be real numbers (float or integer), got an array of "
                              f"{getattr(array, 'dtype', None) or np.asarray(array).dtype}")
    tensor = torch.as_tensor(array)
    if tensor.ndim != 2:
        raise DeepMetricError(f"{name} must be a 2-D array (n, D), got shape {tuple(tensor.shape)}")
    if tensor.shape[0] == 0:
        raise DeepMetricError(f"{name} are empty (0 rows)")
    tensor = tensor.float()
    if not torch.isfinite(tensor).all():
        raise DeepMetricError(f"{name} contains NaN or infinite values")
    return F.normalize(tensor, dim=1)


def _as_labels(array: np.ndarray | torch.Tensor, n: int, name: str) -> torch.Tensor:
    values = array if isinstance(array, torch.Tensor) else np.asarray(array)
    if isinstance(values, np.ndarray) and values.dtype.kind not in "biuf":
        raise DeepMetricError(f"{name} must be integer class labels, got an array of {values.dtype} (map names to "
                              "integers first)")
    if values.ndim != 1 and not (values.ndim == 2 and values.shape[1] == 1):
        raise DeepMetricError(f"{name} must be a 1-D array of one label per embedding, got shape "
                              f"{tuple(values.shape)}")
    labels = torch.as_tensor(values).reshape(-1)
    if labels.dtype.is_floating_point:
        if not torch.equal(labels, labels.round()):
            raise DeepMetricError(f"{name} must be integer class labels")
    labels = labels.long()
    if len(labels) != n:
        raise DeepMetricError(f"{name}: {len(labels)} entries for {n} embeddings")
    return labels


def relevant_counts(query_labels: torch.Tensor, gallery_labels: torch.Tensor,
                    self_index: torch.Tensor | None) -> torch.Tensor:
    """R of each query: gallery items of its class, not counting its own row."""
    classes, counts = torch.unique(gallery_labels, return_counts=True)
    position = torch.searchsorted(classes, query_labels).clamp_max(len(classes) - 1)
    r = torch.where(classes[position] == query_labels, counts[position], torch.zeros_like(position))
    if self_index is not None:
        r = r - (self_index >= 0).long()
    return r


SHOWN_FROM = 10**9
"""Query x gallery pairs from which the ranking shows a progress bar (SOP's 60,502 x 60,502: seconds to a minute on
a CPU), and embeddings x clusters from which NMI's k-means is announced (SOP: 11,316 clusters, 15 s)."""

FAISS_KMEANS_FROM = 100
"""Clusters from which NMI's k-means is faiss' (as pytorch-metric-learning's): below, scikit-learn's k-means++ is fast
and finds separated clusters that faiss' random initialisation can miss (perfect embeddings of 3 classes of 5, 2
and 2 images scored NMI 0.70 with faiss); from 100 clusters faiss is 10-100 times faster (816 clusters of 3,264
embeddings: 0.3 s against 41 s)."""

SKLEARN_SLOW_FROM = 200
"""From this many clusters, NMI without faiss warns that it is slow."""


def kmeans_backend(n_clusters: int, device: torch.device | None) -> str:
    """Which k-means ``kmeans_labels`` runs: ``torch`` (faiss' copy, on ``device``), ``faiss`` or ``scikit-learn``."""
    if n_clusters < FAISS_KMEANS_FROM:
        return "scikit-learn"
    if device is not None:
        return "torch"
    return "faiss" if faiss_available() else "scikit-learn"


def kmeans_labels(x: np.ndarray, n_clusters: int, seed: int = 0, device: torch.device | None = None) -> np.ndarray:
    """k-means assignments for NMI: from ``FAISS_KMEANS_FROM`` clusters faiss' k-means (random initialisation, 20
    iterations, seed ``seed``: what pytorch-metric-learning's NMI runs), on ``device`` by its torch copy
    (``kmeans.py``) when one is given (a GPU), else by faiss; below, and wherever faiss is not installed and no
    device is given, scikit-learn's (one k-means++ initialisation), with a warning from ``SKLEARN_SLOW_FROM``
    clusters."""
    backend = kmeans_backend(n_clusters, device)
    if backend == "torch":
        on_device = torch.as_tensor(np.ascontiguousarray(x, dtype=np.float32)).to(device)
        return kmeans_faiss_rule(on_device, n_clusters, niter=20, seed=seed).cpu().numpy()
    if backend == "faiss":
        import faiss

        points = np.ascontiguousarray(x, dtype=np.float32)
        # min_points_per_centroid=1: faiss would otherwise print a warning on stderr whenever there are fewer
        # than 39 points per cluster (every retrieval benchmark: 5 to 60 images per class)
        kmeans = faiss.Kmeans(points.shape[1], n_clusters, niter=20, seed=seed, verbose=False,
                              min_points_per_centroid=1)
        kmeans.train(points)
        return kmeans.index.search(points, 1)[1][:, 0]
    if n_clusters >= SKLEARN_SLOW_FROM:
        log.warning("NMI: k-means with %d clusters by scikit-learn, because faiss is not installed; this is slow "
                    "(pip install faiss-cpu, or eval.nmi=false)", n_clusters)
    from sklearn.cluster import KMeans
    from sklearn.exceptions import ConvergenceWarning

    with warnings.catch_warnings(record=True) as caught:  # scikit-learn's own warning printed its source line
        warnings.simplefilter("always", ConvergenceWarning)
        assignments = KMeans(n_clusters=n_clusters, n_init=1, random_state=seed).fit_predict(x)
    if any(issubclass(w.category, ConvergenceWarning) for w in caught):
        log.warning("NMI: k-means found %d distinct clusters of the %d asked for: the embeddings hold duplicate "
                    "points (a collapsed model?)", len(np.unique(assignments)), n_clusters)
    return assignments


def kmeans_device(engine: str) -> torch.device | None:
    """Where NMI's k-means runs for kNN ``engine``: this process's GPU for ``cuda``, else None (the CPU's own)."""
    return torch.device("cuda", torch.cuda.current_device()) if resolve_engine(engine) == "cuda" else None


def kmeans_name(n_clusters: int, engine: str) -> str:
    """Which k-means ``nmi_score`` runs, in words (for the log)."""
    backend = kmeans_backend(n_clusters, kmeans_device(engine))
    return "faiss' rule, in torch on the GPU" if backend == "torch" else backend


def nmi_score(embeddings: np.ndarray | torch.Tensor, labels: np.ndarray | torch.Tensor, seed: int = 0,
              engine: str = "torch") -> float:
    """NMI between the labels and a k-means clustering with as many clusters as classes; with the ``cuda`` engine
    (``auto`` where torch sees a GPU) the k-means runs on the GPU (``kmeans_labels``)."""
    from sklearn.metrics import normalized_mutual_info_score

    device = kmeans_device(engine)
    x = np.asarray(embeddings, dtype=np.float32)
    y = np.asarray(labels)
    n_clusters = len(np.unique(y))
    if n_clusters < 2 or n_clusters >= len(y):
        return float("nan")
    return float(normalized_mutual_info_score(y, kmeans_labels(x, n_clusters, seed, device)))


@dataclass(frozen=True)
class PerQuery:
    """Each query's results, in query order: what every ranking metric above averages (``per_query_metrics``), kept
    so that two runs on the same test set can be compared query by query (a study's paired bootstrap).

    ``first_hit`` (Q,) int32: 0-based rank of the query's first neighbour of its class, ``NO_HIT`` (-1) when none is
    among the ``depth`` neighbours ranked; ``average_precision`` (Q,) float32: AP@R, the query's term of MAP@R;
    ``r_precision`` (Q,) float32; ``relevant`` (Q,) int32: R, the gallery items of its class (its own row not
    counted); a query with R = 0 is left out of every metric.
    """

    first_hit: np.ndarray
    average_precision: np.ndarray
    r_precision: np.ndarray
    relevant: np.ndarray
    depth: int

    @property
    def counted(self) -> np.ndarray:
        """(Q,) bool: the queries every metric averages over (R > 0)."""
        return self.relevant > 0


NO_HIT = -1
"""``PerQuery.first_hit`` of a query with no neighbour of its class among the ``depth`` ranked."""


def per_query_metrics(per_query: PerQuery, recall_at: Sequence[int]) -> dict[str, float]:
    """Recall@K (the share of counted queries whose first hit ranks below K), MAP@R and R-precision (means) of
    ``per_query``: the figures ``compute_metrics`` reports, by the same float32 reductions."""
    valid = torch.from_numpy(per_query.counted)
    first_hit = torch.from_numpy(per_query.first_hit.astype(np.int64))[valid]
    found = first_hit != NO_HIT
    results = {f"recall@{kk}": float((found & (first_hit < kk)).float().mean()) for kk in sorted({int(k) for k in
                                                                                                  recall_at})}
    results["map@r"] = float(torch.from_numpy(per_query.average_precision)[valid].mean())
    results["r_precision"] = float(torch.from_numpy(per_query.r_precision)[valid].mean())
    return results


def rank_queries(query: torch.Tensor, query_labels: torch.Tensor, gallery: torch.Tensor,
                 gallery_labels: torch.Tensor, self_index: torch.Tensor | None, recall_at: Sequence[int],
                 memory_mb: float = 256.0, engine: str = "auto", progress: bool = True,
                 rerank: Rerank | None = None) -> PerQuery:
    """Rank ``gallery`` for each of the l2-normalised ``query`` rows (one exact kNN pass, ``iter_knn``; re-ranked by
    ``rerank``, ``rerank.py``) and keep each query's first hit, AP@R and R-precision (``PerQuery``)."""
    recall_at = sorted({int(k) for k in recall_at})
    r = relevant_counts(query_labels, gallery_labels, self_index)
    valid = r > 0
    if not valid.any():
        raise DeepMetricError("no query has another item of its class in the gallery; nothing to retrieve")
    if not valid.all():
        log.warning("%d of %d queries have no other item of their class in the gallery and are left out",
                    int((~valid).sum()), len(valid))
    embedding_sets = [("query", query)] + ([("gallery", gallery)] if gallery is not query else [])
    for name, x in embedding_sets:
        zero = int((x.abs().sum(dim=1) == 0).sum())
        if zero:
            log.warning("%d of %d %s embeddings are all zeros: their cosine similarity is 0 with every item, so "
                        "where their matches rank is decided by ties", zero, x.shape[0], name)
    searchable = gallery.shape[0] - (1 if self_index is not None and (self_index >= 0).any() else 0)
    k = min(searchable, max(max(recall_at), int(r.max())))
    beyond = [kk for kk in recall_at if kk >= searchable]
    if beyond:
        log.warning("Recall@%s: K reaches the %d items each query is ranked against, so every query with a match "
                    "counts as a hit (1.0)", ",".join(map(str, beyond)), searchable)
    first_hit = torch.empty(len(r), dtype=torch.long)
    average_precision = torch.empty(len(r))
    r_precision = torch.empty(len(r))
    ranks = torch.arange(1, k + 1, dtype=torch.float32)
    bar = progress_bar(total=len(r), desc="ranking", unit="query",
                       disable=not progress or len(r) * gallery.shape[0] < SHOWN_FROM)
    neighbours = (iter_knn(query, gallery, k, self_index, memory_mb, engine) if rerank is None else
                  reranked_knn(query, gallery, k, self_index, rerank, memory_mb, engine, progress))
    for start, _, indices in neighbours:
        stop = start + len(indices)
        bar.update(len(indices))
        relevant = gallery_labels[indices] == query_labels[start:stop, None]  # (b, k)
        first_hit[start:stop] = torch.where(relevant.any(dim=1), relevant.float().argmax(dim=1), NO_HIT)
        r_block = r[start:stop].clamp_min(1)
        within_r = ranks[None, :] <= r_block[:, None]
        hits = (relevant & within_r).float()
        precision_at_i = hits.cumsum(dim=1) / ranks[None, :]
        average_precision[start:stop] = (precision_at_i * hits).sum(dim=1) / r_block
        r_precision[start:stop] = hits.sum(dim=1) / r_block
    bar.close()
    return PerQuery(first_hit.numpy().astype(np.int32), average_precision.numpy(), r_precision.numpy(),
                    r.numpy().astype(np.int32), k)


def compute_metrics(query: torch.Tensor, query_labels: torch.Tensor, gallery: torch.Tensor,
                    gallery_labels: torch.Tensor, self_index: torch.Tensor | None, recall_at: Sequence[int],
                    nmi: bool = True, memory_mb: float = 256.0, engine: str = "auto",
                    progress: bool = True, rerank: Rerank | None = None) -> dict[str, float | None]:
    """Metrics of l2-normalised ``query`` against ``gallery`` (see the module docstring); with ``progress``, the
    ranking of a large split (``SHOWN_FROM`` pairs) shows a bar and a large NMI k-means is announced, on stderr;
    ``rerank``: the ranking metrics after that re-ranking (``rerank.py``)."""
    return compute_metrics_per_query(query, query_labels, gallery, gallery_labels, self_index, recall_at, nmi,
                                     memory_mb, engine, progress, rerank)[0]


def compute_metrics_per_query(query: torch.Tensor, query_labels: torch.Tensor, gallery: torch.Tensor,
                              gallery_labels: torch.Tensor, self_index: torch.Tensor | None,
                              recall_at: Sequence[int], nmi: bool = True, memory_mb: float = 256.0,
                              engine: str = "auto", progress: bool = True,
                              rerank: Rerank | None = None) -> tuple[dict[str, float | None], PerQuery]:
    """``compute_metrics`` and the ``PerQuery`` results its ranking metrics average (from the same kNN pass)."""
    per_query = rank_queries(query, query_labels, gallery, gallery_labels, self_index, recall_at, memory_mb, engine,
                             progress, rerank)
    results: dict[str, float | None] = dict(per_query_metrics(per_query, recall_at))
    if nmi:
        classes = len(torch.unique(query_labels))
        if progress and len(query_labels) * classes >= SHOWN_FROM // 1000:
            log.info("NMI: k-means of %d embeddings into %d clusters (%s)", len(query_labels), classes,
                     kmeans_name(classes, engine))
        score = nmi_score(query.numpy(), query_labels.numpy(), engine=engine)
        if score != score:
            log.warning("NMI is undefined here (the %d queries hold %d classes; it needs 2 or more, and fewer "
                        "classes than queries): reported as null", len(query_labels),
                        len(torch.unique(query_labels)))
        results["nmi"] = None if score != score else score
    return results, per_query


def retrieval_metrics(query: np.ndarray | torch.Tensor, query_labels: np.ndarray | torch.Tensor,
                      gallery: np.ndarray | torch.Tensor | None = None,
                      gallery_labels: np.ndarray | torch.Tensor | None = None,
                      recall_at: Sequence[int] = (1, 2, 4, 8), nmi: bool = True,
                      engine: str = "auto", progress: bool = False,
                      rerank: Rerank | str | None = None) -> dict[str, float | None]:
    """Recall@K, MAP@R, R-precision and NMI (the module docstring defines them; thesis §2.6.2).

    Args:
        query: (N, D) query embeddings (l2-normalised here).
        query_labels: (N,) integer class labels.
        gallery: (M, D) gallery embeddings, or None: every query is ranked against all the others, its own row
            removed by index; with a gallery, queries are ranked against it only (the In-Shop protocol).
        gallery_labels: (M,) labels of the gallery.
        recall_at: the ranks K of Recall@K.
        nmi: also compute NMI (a k-means of the queries).
        engine: auto, torch, numpy, faiss or cuda: the speed changes, never the result (all exact; ``knn.py``
            on float rounding).
        progress: on stderr, a bar over the ranking of a large split and a line before a large NMI k-means.
        rerank: re-rank before the ranking metrics: ``"k-reciprocal"``, ``"qe"``, ``"dba"``, ``"dba+qe"`` with
            their defaults, or settings (``rerank.KReciprocal(k1=20, k2=6, lambda_value=0.3)``,
            ``rerank.QueryExpansion(qe_n=10, dba_n=0, alpha=3.0)``); NMI is the embeddings' either way.

    Returns:
        ``{"recall@K": ..., "map@r": ..., "r_precision": ..., "nmi": ...}`` as fractions, the keys of
        ``deepmetric metrics --json``; ``nmi`` is None where it is undefined.
    """
    rerank = as_rerank(rerank)
    q = _as_tensor(query, "query embeddings")
    ql = _as_labels(query_labels, q.shape[0], "query labels")
    if gallery is None:
        if gallery_labels is not None:
            raise DeepMetricError("gallery labels given without gallery embeddings")
        return compute_metrics(q, ql, q, ql, torch.arange(q.shape[0]), recall_at, nmi, engine=engine,
                               progress=progress, rerank=rerank)
    if gallery_labels is None:
        raise DeepMetricError("gallery embeddings given without gallery labels")
    g = _as_tensor(gallery, "gallery embeddings")
    gl = _as_labels(gallery_labels, g.shape[0], "gallery labels")
    if g.shape[1] != q.shape[1]:
        raise DeepMetricError(f"query embeddings have {q.shape[1]} dimensions, gallery embeddings {g.shape[1]}")
    return compute_metrics(q, ql, g, gl, None, recall_at, nmi, engine=engine, progress=progress, rerank=rerank)
