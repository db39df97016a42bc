"""Mean average precision for instance retrieval with explicit ground truth (Holidays, Oxford5k, Paris6k).

Each query has a set of positive gallery items and, optionally, junk items that are removed from its
ranking (Oxford/Paris "junk"; the query image itself in Holidays, where queries are in the collection).
The gallery is ranked by decreasing cosine similarity (ties by gallery index).

Average precision, ``method``:

- ``trapezoid`` (default): ``sum_j (P_{j-1} + P_j) / 2 · 1/|pos|`` over the positives in rank order, with
  ``P_{j-1} = (j-1)/r_j`` (1 at rank 0) and ``P_j = j/(r_j + 1)`` for the j-th positive at 0-based rank
  r_j: the rule of the official evaluation code of Oxford (``compute_ap``) and Holidays, by which the
  thesis' ISTA tables are computed;
- ``step``: ``(1/|pos|) sum_j j / (r_j + 1)``, the non-interpolated AP (scikit-learn's), which is the
  thesis' own definition (eq. 2.27, its example 1/3 (1/2 + 2/3 + 3/4) ~ 0.64; trapezoid gives 0.51).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import DeepMetricError


def average_precision(positive_ranks: np.ndarray, n_positives: int, method: str = "trapezoid") -> float:
    """AP from the sorted 0-based ranks of the positives found (``n_positives`` in all; missing ones count 0)."""
    if n_positives == 0:
        raise DeepMetricError("average precision needs at least one positive")
    ranks = np.sort(np.asarray(positive_ranks, dtype=np.float64))
    found = np.arange(1, len(ranks) + 1)
    after = found / (ranks + 1)
    if method == "step":
        return float(after.sum() / n_positives)
    if method != "trapezoid":
        raise DeepMetricError(f"average precision: method must be 'trapezoid' or 'step', got '{method}'")
    before = np.where(ranks == 0, 1.0, (found - 1) / np.maximum(ranks, 1))
    return float(((before + after) / 2).sum() / n_positives)


def mean_average_precision(query: np.ndarray, gallery: np.ndarray, positives: Sequence[Sequence[int]],
                           junk: Sequence[Sequence[int]] | None = None, method: str = "trapezoid") -> float:
    """mAP of queries (Q, D) against a gallery (G, D): ``positives[q]`` / ``junk[q]`` are gallery indices."""
    query, gallery = np.asarray(query, dtype=np.float64), np.asarray(gallery, dtype=np.float64)
    if query.ndim != 2 or gallery.ndim != 2 or query.shape[1] != gallery.shape[1]:
        raise DeepMetricError(f"mAP: query {query.shape} and gallery {gallery.shape} must be (n, D) with the same D")
    if len(positives) != len(query) or (junk is not None and len(junk) != len(query)):
        raise DeepMetricError(f"mAP: {len(query)} queries but {len(positives)} positive lists"
                              + (f" and {len(junk)} junk lists" if junk is not None else ""))
    query = query / np.linalg.norm(query, axis=1, keepdims=True).clip(1e-12)
    gallery = gallery / np.linalg.norm(gallery, axis=1, keepdims=True).clip(1e-12)
    scores = query @ gallery.T
    aps = []
    for q in range(len(query)):
        order = np.lexsort((np.arange(len(gallery)), -scores[q]))
        if junk is not None and len(junk[q]):
            order = order[~np.isin(order, np.asarray(junk[q]))]
        wanted = np.asarray(positives[q], dtype=int)
        aps.append(average_precision(np.flatnonzero(np.isin(order, wanted)), len(wanted), method))
    return float(np.mean(aps))


def label_ground_truth(query_labels: np.ndarray, gallery_labels: np.ndarray,
                       query_in_gallery: np.ndarray | None = None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Positives = gallery items of the query's label; junk = the query's own gallery row (Holidays style:
    ``query_in_gallery[q]`` is its gallery index, or -1)."""
    positives, junk = [], []
    for q, label in enumerate(np.asarray(query_labels)):
        own = -1 if query_in_gallery is None else int(query_in_gallery[q])
        same = np.flatnonzero(np.asarray(gallery_labels) == label)
        positives.append(same[same != own])
        junk.append(np.array([own]) if own >= 0 else np.array([], dtype=int))
    return positives, junk
