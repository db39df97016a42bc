"""The statistics of a study's tables (issue 51 item 4), each against scipy or a slow explicit loop on small
hand-made cases, and the per-query results they rest on (one ranking gives metrics.json and the per-query file)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from deepmetric.evaluation.metrics import NO_HIT, PerQuery, compute_metrics_per_query, per_query_metrics
from deepmetric.evaluation.per_query import load_per_query, query_scores, save_per_query, table_identity
from deepmetric.studies import statistics


def test_mean_std_and_t_interval_are_scipys():
    values = [0.8034, 0.8015, 0.8027, 0.7990]
    found = statistics.summarise(values)
    low, high = stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=stats.sem(values))
    assert found.mean == pytest.approx(np.mean(values)) and found.std == pytest.approx(np.std(values, ddof=1))
    assert (found.low, found.high) == (pytest.approx(low), pytest.approx(high)) and found.n == 4
    one = statistics.summarise([0.5])
    assert (one.mean, one.std, one.n, one.low, one.high) == (0.5, 0.0, 1, None, None)  # one run: no interval


def test_welch_p_is_scipys_and_the_explicit_formula():
    a, b = [0.85, 0.86, 0.84], [0.80, 0.81, 0.79, 0.805]
    ma, mb = np.mean(a), np.mean(b)
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    t = (ma - mb) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))  # Welch-Satterthwaite
    explicit = 2 * stats.t.sf(abs(t), df)
    assert statistics.welch_p(a, b) == pytest.approx(explicit)
    assert statistics.welch_p(a, b) == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue)
    assert statistics.welch_p([0.5], b) is None  # one run: undefined
    assert statistics.welch_p([0.5, 0.5], [0.4, 0.4]) is None  # no spread on either side: undefined, not 0


def test_holm_is_the_hand_computation():
    # sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04, raised to 0.06 by monotonicity)
    assert statistics.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert statistics.holm([0.01, None, 0.04]) == [pytest.approx(0.02), None, pytest.approx(0.04)]  # m = 2
    assert statistics.holm([0.6, 0.7]) == [1.0, 1.0]  # capped at 1
    assert statistics.holm([]) == []


def slow_bootstrap(variant, reference, resamples, seed):
    """The paired bootstrap written out: resample by resample, query by query."""
    rng = np.random.default_rng(seed)
    queries = len(variant[0])
    observed = sum(sum(v) / queries - sum(r) / queries for v, r in zip(variant, reference, strict=True)) / len(variant)
    means = []
    for _ in range(resamples):
        picked = rng.integers(0, queries, size=queries)
        means.append(sum(sum(v[q] - r[q] for q in picked) / queries for v, r in zip(variant, reference, strict=True))
                     / len(variant))
    extreme = sum(abs(m - observed) >= abs(observed) for m in means)
    return observed, np.quantile(means, [0.025, 0.975]), (1 + extreme) / (resamples + 1)


def test_paired_bootstrap_is_the_slow_loop_and_deterministic_by_seed(monkeypatch):
    rng = np.random.default_rng(7)
    variant = [rng.random(9), rng.random(9)]  # two seeds, 9 queries each
    reference = [v - 0.1 + 0.2 * rng.random(9) for v in variant]
    monkeypatch.setattr(statistics, "CHUNK", 7)  # chunks that do not divide the resamples
    found = statistics.paired_bootstrap(variant, reference, resamples=300, seed=[0, 5])
    observed, (low, high), p = slow_bootstrap(variant, reference, 300, [0, 5])
    assert found.difference == pytest.approx(observed) and found.pairs == 2
    assert (found.low, found.high, found.p) == (pytest.approx(low), pytest.approx(high), pytest.approx(p))
    assert statistics.paired_bootstrap(variant, reference, resamples=300, seed=[0, 5]) == found  # same seed, same
    assert statistics.paired_bootstrap(variant, reference, resamples=300, seed=[1, 5]) != found
    assert statistics.stream_seed("abe", "gap") == statistics.stream_seed("abe", "gap") != statistics.stream_seed(
        "gap", "abe")


def test_bootstrap_p_values_at_the_extremes():
    better = [np.ones(50)]
    worse = [np.zeros(50)]
    assert statistics.paired_bootstrap(better, worse, resamples=99).p == pytest.approx(1 / 100)  # never reaches 0
    same = statistics.paired_bootstrap(better, better, resamples=99)
    assert same.difference == 0 and same.p == 1 and same.low == same.high == 0
    with pytest.raises(ValueError, match="same queries"):
        statistics.paired_bootstrap([np.ones(3)], [np.ones(4)])


def test_the_statistics_edge_cases_and_their_messages():
    two = statistics.summarise([0.5, 0.7])  # two repeats: an interval (1 degree of freedom)
    low, high = stats.t.interval(0.95, 1, loc=0.6, scale=stats.sem([0.5, 0.7]))
    assert two.n == 2 and (two.low, two.high) == (pytest.approx(low), pytest.approx(high))
    with pytest.raises(ValueError, match="^no values to summarise$"):
        statistics.summarise([])
    steady, spread = [0.5, 0.5, 0.5], [0.1, 0.2, 0.35]  # one side without spread: Welch is still defined
    with pytest.warns(RuntimeWarning, match="catastrophic cancellation"):  # scipy's, on the side without spread
        expected = stats.ttest_ind(steady, spread, equal_var=False).pvalue
    assert statistics.welch_p(steady, spread) == pytest.approx(expected)
    assert statistics.welch_p(steady, steady) is None and statistics.welch_p([0.5], spread) is None
    with pytest.raises(ValueError, match=r"^the bootstrap needs one reference run per variant run \(paired by "):
        statistics.paired_bootstrap([np.ones(3), np.ones(3)], [np.ones(3)])
    with pytest.raises(ValueError, match="same queries"):
        statistics.paired_bootstrap([np.ones(0)], [np.ones(0)])
    one_query = statistics.paired_bootstrap([np.ones(1)], [np.zeros(1)], resamples=9)
    assert (one_query.difference, one_query.low, one_query.high) == (1, 1, 1)


def test_the_bootstraps_draws_do_not_depend_on_how_they_are_chunked(monkeypatch):
    """A chunk holds at most ``CHUNK_VALUES`` indices: 2 resamples of 4 queries, 1 of 9, here; the same draws."""
    rng = np.random.default_rng(3)
    variant, reference = [rng.random(4), rng.random(4)], [rng.random(4), rng.random(4)]
    whole = statistics.paired_bootstrap(variant, reference, resamples=50, seed=[0, 9])
    monkeypatch.setattr(statistics, "CHUNK_VALUES", 10)
    assert statistics.paired_bootstrap(variant, reference, resamples=50, seed=[0, 9]) == whole
    monkeypatch.setattr(statistics, "CHUNK_VALUES", 3)  # fewer than one resample's queries: one a chunk
    assert statistics.paired_bootstrap(variant, reference, resamples=50, seed=[0, 9]) == whole


def test_float32_scores_are_summed_in_float64():
    """Per-query AP@R may come as float32: the statistics are those of the same values in float64, to the bit."""
    rng = np.random.default_rng(11)
    variant = [rng.random(301, dtype=np.float32) for _ in range(3)]
    reference = [rng.random(301, dtype=np.float32) for _ in range(3)]
    wide = ([v.astype(np.float64) for v in variant], [r.astype(np.float64) for r in reference])
    assert statistics.paired_bootstrap(variant, reference, resamples=200) == statistics.paired_bootstrap(
        *wide, resamples=200)
    means = [np.float32(v.mean()) for v in variant]
    others = [np.float32(r.mean()) for r in reference]
    assert statistics.summarise(means) == statistics.summarise([float(m) for m in means])
    assert statistics.welch_p(means, others) == statistics.welch_p([float(m) for m in means],
                                                                   [float(o) for o in others])


def test_a_comparisons_bootstrap_stream_is_fixed_for_good():
    """The published study pages' bootstrap figures rest on these seeds: a CRC-32 of the names joined by NUL."""
    assert statistics.stream_seed("gap", "abe") == [0, 3389107392]
    assert statistics.stream_seed("diablo", "gap", seed=3) == [3, 3456229288]
    assert statistics.stream_seed("ab", "c") != statistics.stream_seed("a", "bc")


def slow_ranking(query, labels):
    """First hit, AP@R and R-precision of each row against all the others, written out (ties by index)."""
    first, ap, rp = [], [], []
    for q in range(len(query)):
        others = [i for i in range(len(query)) if i != q]
        order = sorted(others, key=lambda i: (-float(query[q] @ query[i]), i))
        relevant = [labels[i] == labels[q] for i in order]
        r = sum(relevant)
        first.append(relevant.index(True) if any(relevant) else NO_HIT)
        hits = relevant[:r]
        ap.append(sum(sum(hits[:i + 1]) / (i + 1) for i in range(r) if hits[i]) / r if r else 0.0)
        rp.append(sum(hits) / r if r else 0.0)
    return np.array(first), np.array(ap), np.array(rp)


def test_per_query_results_are_the_slow_loop_and_give_the_metrics(tmp_path):
    rng = np.random.default_rng(3)
    labels = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 3])  # class 3 has one image: left out of every metric
    x = torch.nn.functional.normalize(torch.as_tensor(rng.normal(size=(10, 4)), dtype=torch.float32), dim=1)
    y = torch.as_tensor(labels)
    metrics, per_query = compute_metrics_per_query(x, y, x, y, torch.arange(10), (1, 2, 4), nmi=False,
                                                   progress=False)
    first, ap, rp = slow_ranking(x.numpy(), labels)
    counted = labels != 3
    assert per_query.counted.tolist() == counted.tolist()
    assert per_query.depth == 4  # the largest K and the largest R: a first hit beyond is "none within 4"
    assert per_query.first_hit[counted].tolist() == np.where(first < 4, first, NO_HIT)[counted].tolist()
    np.testing.assert_allclose(per_query.average_precision[counted], ap[counted], atol=1e-6)
    np.testing.assert_allclose(per_query.r_precision[counted], rp[counted], atol=1e-6)
    assert per_query_metrics(per_query, (1, 2, 4)) == {k: v for k, v in metrics.items() if k != "nmi"}  # exactly
    assert metrics["recall@1"] == pytest.approx(query_scores(per_query, "recall@1").mean())
    assert metrics["map@r"] == pytest.approx(query_scores(per_query, "map@r").mean())
    assert query_scores(per_query, "nmi") is None

    path = tmp_path / "per-query.npz"
    identity = {"queries_sha256": "a" * 64, "gallery_sha256": "b" * 64}
    save_per_query(path, per_query, identity)
    loaded = load_per_query(path)
    assert loaded.identity == identity and per_query_metrics(loaded.per_query, (1, 2, 4)) == per_query_metrics(
        per_query, (1, 2, 4))


def test_a_per_query_file_is_never_unpickled_and_a_bad_one_is_named(tmp_path):
    from deepmetric.errors import DeepMetricError
    from deepmetric.evaluation.per_query import problem

    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, first_hit=np.array([object()], dtype=object))
    assert "not plain data" in problem(pickled)
    text = tmp_path / "text.npz"
    text.write_text("first_hit,ap\n")
    assert "not an .npz archive" in problem(text)
    partial = tmp_path / "partial.npz"
    np.savez(partial, first_hit=np.zeros(3, dtype=np.int32))
    assert problem(partial).startswith("it lacks average_precision")
    per_query = PerQuery(np.array([0, 5]), np.array([1.0, 0.2], dtype=np.float32),
                         np.array([1.0, 0.5], dtype=np.float32), np.array([1, 2]), 2)
    outside = tmp_path / "outside.npz"
    save_per_query(outside, per_query, {"queries_sha256": "a" * 64, "gallery_sha256": "b" * 64})
    assert "out of range" in problem(outside)  # a first hit at rank 5 of 2 ranked
    with pytest.raises(DeepMetricError, match="outside.npz is not a per-query file"):
        load_per_query(outside)


def test_the_query_identity_pairs_the_same_test_set_wherever_it_is_unpacked(tmp_path):
    from deepmetric.data.table import RetrievalTable

    def table(root, order=(0, 1, 2, 3)):
        names = [f"{root}/a/{i}.png" for i in order]
        return RetrievalTable("t", names, [0, 0, 1, 1], ["test"] * 4, [True] * 4, [True] * 4)

    here, there = table("/data/emoji"), table("/home/me/elsewhere/emoji")
    assert table_identity(here) == table_identity(there)  # the same images, relative to the data set's folder
    assert table_identity(here) != table_identity(table("/data/emoji", (1, 0, 2, 3)))  # another order
    pixels = RetrievalTable("t", np.zeros((4, 2, 2), np.uint8), [0, 0, 1, 1], ["test"] * 4, [True] * 4, [True] * 4)
    assert len(table_identity(pixels)["queries_sha256"]) == 64
