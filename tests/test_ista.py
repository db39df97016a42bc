"""ISTA (thesis §4.2) on small synthetic feature maps, and mAP for query/gallery instance retrieval."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import average_precision_score

from deepmetric.aggregation import ISTA, neighbour_pairs
from deepmetric.errors import ConfigError
from deepmetric.evaluation.map import average_precision, label_ground_truth, mean_average_precision

A, B, E = np.array([3.0, 0.0, 0.0]), np.array([0.0, 3.0, 0.0]), np.array([0.0, 0.0, 1.0])


def layout_map(kind: str, flip: float, phase: int, rows: int = 6, cols: int = 8) -> np.ndarray:
    """Columns alternate material A and B, each feature ±E. ``rows``: one sign per row (horizontal A-B
    neighbours agree); ``checker``: signs alternate in both directions (they disagree). Both layouts hold
    the same multiset of features and the same vertical pairs; only the A-B pairs differ."""
    ys, xs = np.mgrid[:rows, :cols]
    material = np.where(((xs + phase) % 2 == 0)[..., None], A, B)
    sign = (-1.0) ** ys if kind == "rows" else (-1.0) ** (xs + ys)
    return material + flip * sign[..., None] * E


def test_neighbour_pairs():
    fmap = np.arange(2 * 3 * 1, dtype=float).reshape(2, 3, 1)  # values = 3 y + x
    x, xu = neighbour_pairs(fmap, "4")
    pairs = sorted(zip(x[:, 0].tolist(), xu[:, 0].tolist(), strict=True))
    assert len(pairs) == 2 * (2 * 2 + 3 * 1)
    assert all(abs(a - b) in (1, 3) for a, b in pairs) and (0.0, 1.0) in pairs and (1.0, 0.0) in pairs
    assert len(neighbour_pairs(fmap, "8")[0]) == 14 + 2 * 2 * 2
    x, xu = neighbour_pairs(fmap, "self")
    assert np.array_equal(x, xu) and len(x) == 6
    with pytest.raises(ConfigError, match="neighbourhood must be one of"):
        neighbour_pairs(fmap, "9")
    with pytest.raises(ConfigError, match="dim .* projects block-reduced signatures; set block_fraction"):
        ISTA(block_fraction=None, dim=8)  # it raised a KeyError in fit()


def test_centering_truncation_and_cross_entry_normalisation():
    rng = np.random.default_rng(0)
    maps = [rng.normal(size=(4, 5, 6)) + np.linspace(0, 0.5, 6) for _ in range(12)]
    ista = ISTA(codewords=3, variance=0.9, block_fraction=None).fit(maps)
    for pair, (_, s, _) in ista.bases.items():  # the fewest components keeping 90% of the energy
        x_sum, count = 0, 0
        for m in maps:
            groups = ista._grouped_pairs(m)
            if pair in groups:
                x_sum, count = x_sum + groups[pair][0].T @ groups[pair][1], count + len(groups[pair][0])
        full = np.linalg.svd(x_sum / count, compute_uv=False)
        energy = np.cumsum(full**2) / (full**2).sum()
        assert energy[len(s) - 1] >= 0.9 - 1e-9 and (len(s) == 1 or energy[len(s) - 2] < 0.9)
    # eq. 4.4 centering: the centred blocks of the fitting images sum to zero
    total = {p: sum(ista.centred_blocks(m)[p] for m in maps) for p in ista.bases}
    assert all(np.allclose(t, 0, atol=1e-9) for t in total.values())
    # eq. 4.7: before the final l2, each component has unit norm across the diagonal and the off-diagonal
    # pairs, so after it they all share one norm
    blocks = ista.signature_blocks(maps[0])
    common = []
    for diagonal in (True, False):
        squares = np.zeros((6, 6))
        for p, b in blocks.items():
            if (p[0] == p[1]) == diagonal:
                squares[: len(b), : len(b)] += b**2
        common.extend(squares[squares > 0].tolist())
    assert len(common) > 4 and np.allclose(common, common[0])
    assert np.linalg.norm(ista.signature(maps[0])) == pytest.approx(1.0)


def test_block_reduction_keeps_inner_products_and_full_reduction_whitens():
    rng = np.random.default_rng(1)
    maps = [rng.normal(size=(4, 4, 5)) + 1.0 for _ in range(10)]
    full_rank = ISTA(codewords=2, variance=1.0, block_fraction=1.0).fit(maps)
    raw = np.stack([full_rank.signature(m) for m in maps])
    reduced = np.stack([full_rank._block_reduce(full_rank.signature_blocks(m)) for m in maps])
    assert np.allclose(reduced @ reduced.T, raw @ raw.T, atol=1e-9)
    whitened = ISTA(codewords=2, variance=1.0, block_fraction=1.0, dim=4).fit(maps)
    projected = np.stack([whitened.full_projection @ whitened._block_reduce(whitened.signature_blocks(m))
                          for m in maps])
    assert np.allclose((projected**2).sum(axis=0), 1.0)  # every kept direction has unit energy
    assert np.allclose(np.linalg.norm(np.stack([whitened.encode(m) for m in maps]), axis=1), 1.0)


def test_the_self_neighbourhood_sees_a_bag_of_features_and_the_4_neighbourhood_sees_the_layout():
    rng = np.random.default_rng(3)
    maps = [rng.normal(size=(5, 6, 4)) for _ in range(8)]
    shuffled = rng.permutation(maps[0].reshape(30, 4)).reshape(5, 6, 4)
    for neighbourhood, invariant in (("self", True), ("4", False)):
        ista = ISTA(codewords=2, neighbourhood=neighbourhood, variance=1.0, block_fraction=None).fit(maps)
        same = np.allclose(ista.signature(maps[0]), ista.signature(shuffled), atol=1e-9)
        assert same is invariant


def test_spatial_pairs_retrieve_layouts_that_a_bag_of_features_cannot():
    """Same features, different arrangement: mAP 1 with the 4-neighbourhood; Ω(x) = {x} gives both layouts
    the same signature, so it cannot rank one above the other."""
    settings = [(kind, flip, phase) for kind in ("rows", "checker") for flip in (1.0, -1.0) for phase in (0, 1)]
    maps = [layout_map(*s) for s in settings]
    labels = np.array([0] * 4 + [1] * 4)
    positives, junk = label_ground_truth(labels, labels, np.arange(8))
    rng = np.random.default_rng(4)  # fit on noisy copies, so that the mean pair tensors have full rank
    fit = [m + 0.1 * rng.normal(size=m.shape) for m in maps for _ in range(3)]
    scores, codes = {}, {}
    for neighbourhood in ("4", "self"):
        ista = ISTA(codewords=2, neighbourhood=neighbourhood, variance=1.0, block_fraction=None).fit(fit)
        codes[neighbourhood] = np.stack([ista.encode(m) for m in maps])
        scores[neighbourhood] = mean_average_precision(codes[neighbourhood], codes[neighbourhood], positives, junk)
    assert scores["4"] == pytest.approx(1.0)
    assert np.allclose(codes["self"][:4], codes["self"][4:], atol=1e-9) and scores["self"] < 0.75


def test_average_precision_rules():
    # positives at ranks 0, 2 of 3 positives (the third never retrieved)
    assert average_precision(np.array([0, 2]), 3, "step") == pytest.approx((1 + 2 / 3) / 3)
    assert average_precision(np.array([0, 2]), 3) == pytest.approx(((1 + 1) / 2 + (1 / 2 + 2 / 3) / 2) / 3)
    rng = np.random.default_rng(0)
    relevant = rng.random(30) < 0.3
    ranks = np.flatnonzero(relevant)
    sk = average_precision_score(relevant, -np.arange(30))
    assert average_precision(ranks, len(ranks), "step") == pytest.approx(sk)
    with pytest.raises(Exception, match="method must be"):
        average_precision(ranks, 3, "11-point")


def test_mean_average_precision_with_junk_and_self_exclusion():
    gallery = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.8, 0.3]])
    query = np.array([[1.0, 0.05]])
    # ranking: 0, 1, 3, 2; positives {1, 2}; junk {0} removed -> ranks of positives: 0 and 2
    value = mean_average_precision(query, gallery, [[1, 2]], [[0]], method="step")
    assert value == pytest.approx((1 + 2 / 3) / 2)
    labels = np.array([0, 0, 1, 1])
    positives, junk = label_ground_truth(labels[:2], labels, np.array([0, 1]))
    assert [p.tolist() for p in positives] == [[1], [0]] and [j.tolist() for j in junk] == [[0], [1]]
    assert mean_average_precision(gallery[:2], gallery, positives, junk) == pytest.approx(1.0)
