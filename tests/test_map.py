"""mAP with explicit ground truth (``deepmetric.evaluation.map``) against a slow explicit loop, ties included.

The contract (the module's docstring): the gallery is ranked by decreasing cosine similarity, exactly equal
similarities by increasing gallery index; a query's junk items are removed from its ranking; AP is Oxford's
``compute_ap`` (``trapezoid``) or the non-interpolated AP (``step``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from deepmetric.evaluation.map import label_ground_truth, mean_average_precision


def slow_ranking(query: np.ndarray, gallery: np.ndarray) -> list[int]:
    """Gallery indices by decreasing cosine similarity, ties by increasing index: one item at a time."""
    def cosine(a, b):
        dot = sum(float(x) * float(y) for x, y in zip(a, b, strict=True))
        return dot / (math.sqrt(sum(float(x) ** 2 for x in a)) * math.sqrt(sum(float(y) ** 2 for y in b)))
    scored = [(cosine(query, g), i) for i, g in enumerate(gallery)]
    return [i for _, i in sorted(scored, key=lambda item: (-item[0], item[1]))]


def slow_average_precision(ranking: list[int], positives, junk, method: str) -> float:
    """Oxford's ``compute_ap`` (trapezoid) or the mean of the precisions at each positive (step)."""
    positives, junk = set(int(p) for p in positives), set(int(j) for j in junk)
    recall_before, precision_before, ap, found, rank = 0.0, 1.0, 0.0, 0, 0
    for item in ranking:
        if item in junk:
            continue
        if item in positives:
            found += 1
        recall, precision = found / len(positives), found / (rank + 1)
        if method == "trapezoid":
            ap += (recall - recall_before) * (precision_before + precision) / 2
        elif item in positives:
            ap += precision / len(positives)
        recall_before, precision_before, rank = recall, precision, rank + 1
    return ap


def slow_map(query, gallery, positives, junk, method):
    junk = junk if junk is not None else [[] for _ in positives]
    return float(np.mean([slow_average_precision(slow_ranking(q, gallery), p, j, method)
                          for q, p, j in zip(query, positives, junk, strict=True)]))


def test_ties_are_ranked_by_the_lower_gallery_index_by_hand():
    # gallery 0 and 1 are one direction (1 scaled by 2: an exact tie); gallery 2 is further from the query
    gallery = np.array([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0]])
    query = np.array([[1.0, 0.5]])
    # ranking 0, 1, 2: the positive {1} sits at rank 1 (it would be rank 0 if ties went to the higher index)
    assert mean_average_precision(query, gallery, [[1]], method="step") == pytest.approx(1 / 2)
    # trapezoid: precision 0 after the miss at rank 0, 1/2 after the hit at rank 1 -> (0 + 1/2) / 2
    assert mean_average_precision(query, gallery, [[1]]) == pytest.approx(1 / 4)
    assert mean_average_precision(query, gallery, [[0]], method="step") == pytest.approx(1.0)
    # junk {0} removes the first of the tie: the positive {1} is now first
    assert mean_average_precision(query, gallery, [[1]], [[0]], method="step") == pytest.approx(1.0)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("method", ["trapezoid", "step"])
def test_mean_average_precision_equals_a_slow_loop_with_many_exact_ties(seed, method):
    rng = np.random.default_rng(seed)
    directions = rng.normal(size=(5, 4))
    # every direction 3 to 5 times, scaled by powers of two (normalisation keeps those bitwise equal)
    rows = [directions[d] * 2.0 ** int(rng.integers(-3, 4)) for d in range(5) for _ in range(int(rng.integers(3, 6)))]
    gallery = np.stack(rows)[rng.permutation(len(rows))]
    query = np.concatenate([rng.normal(size=(4, 4)), directions[:2] * 3.0])
    positives, junk = [], []
    for _ in range(len(query)):
        shuffled = rng.permutation(len(gallery))
        n_pos, n_junk = int(rng.integers(1, len(gallery) // 2)), int(rng.integers(0, 4))
        positives.append(np.sort(shuffled[:n_pos]))
        junk.append(np.sort(shuffled[n_pos:n_pos + n_junk]))
    for with_junk in (None, junk):
        expected = slow_map(query, gallery, positives, with_junk, method)
        assert mean_average_precision(query, gallery, positives, with_junk, method) == pytest.approx(expected,
                                                                                                     abs=1e-12)


def test_label_ground_truth_with_duplicated_images_matches_the_slow_loop():
    """Holidays style: the queries are gallery rows (their own row is junk); duplicated images tie."""
    rng = np.random.default_rng(7)
    base = rng.normal(size=(4, 3))
    gallery = np.concatenate([base, base, base[:2] * 4.0])  # rows 0, 4, 8 one image; 1, 5, 9 another; ...
    labels = np.array([0, 1, 0, 1, 1, 0, 1, 0, 0, 1])
    rows = np.array([0, 1, 4, 8, 9])
    positives, junk = label_ground_truth(labels[rows], labels, rows)
    for method in ("trapezoid", "step"):
        expected = slow_map(gallery[rows], gallery, positives, junk, method)
        assert mean_average_precision(gallery[rows], gallery, positives, junk, method) == pytest.approx(expected,
                                                                                                        abs=1e-12)
