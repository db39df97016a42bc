"""Re-ranking (evaluation/rerank.py, kreciprocal.py, expansion.py) against slow explicit references.

The k-reciprocal reference below is the authors' dense algorithm written out with loops over a full similarity
matrix, with the decisions kreciprocal.py documents (self first in N(i, k), ties by index, rows of distances divided
by their largest value, the strict 2/3 rule, sums in increasing index order). Its embeddings are exact: unit vectors
whose 16 non-zero coordinates are ±1/4, so every similarity is a multiple of 1/16 in float32 and float64 alike and
ties are everywhere; on those, the implementation's d* must be bitwise the reference's and its rankings equal.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from deepmetric.errors import DeepMetricError
from deepmetric.evaluation import retrieval_metrics
from deepmetric.evaluation.expansion import expand, expanded_embeddings
from deepmetric.evaluation.kreciprocal import (
    encode_all,
    k_reciprocal_knn,
    k_reciprocal_search,
    neighbour_graph,
    reranked_blocks,
)
from deepmetric.evaluation.rerank import (
    KReciprocal,
    QueryExpansion,
    as_rerank,
    rerank_settings,
    reranked_knn,
    reranked_search,
)


def dyadic_units(n: int, dim: int = 24, seed: int = 0, copies: int = 4) -> np.ndarray:
    """``n`` unit vectors with 16 coordinates ±1/4 (the rest 0), the last ``copies`` rows exact copies of earlier
    ones: every dot product is exact."""
    rng = np.random.default_rng(seed)
    x = np.zeros((n, dim), dtype=np.float32)
    for row in x[:n - copies]:
        row[rng.choice(dim, 16, replace=False)] = rng.choice([-0.25, 0.25], 16)
    x[n - copies:] = x[rng.choice(n - copies, copies, replace=False)]
    return x


# -- the slow references --------------------------------------------------------------------------------------------

def reference_ranks(s: np.ndarray) -> list[list[int]]:
    """Each item, then the others by (similarity desc, index asc)."""
    n = len(s)
    return [[i] + sorted((j for j in range(n) if j != i), key=lambda j: (-s[i, j], j)) for i in range(n)]


def reference_k_reciprocal(x: np.ndarray, query_rows, gallery_rows, k1: int, k2: int, lam: float) -> np.ndarray:
    """d* (len(query_rows), len(gallery_rows)) of Zhong et al.'s Eqs. 3-12 over the set ``x``, with loops."""
    x = x.astype(np.float64)
    s = x @ x.T
    n = len(s)
    d = 2.0 - 2.0 * s
    np.fill_diagonal(d, 0.0)
    largest = d.max(axis=1)
    dt = d / np.where(largest > 0, largest, 1.0)[:, None]
    rank = reference_ranks(s)

    def neighbours(i, k):  # Eq. 3, the item itself first
        return rank[i][:k + 1]

    def reciprocal(i, k):  # Eq. 4
        return [j for j in neighbours(i, k) if i in neighbours(j, k)]

    v = np.zeros((n, n))
    for i in range(n):
        mine = reciprocal(i, k1)
        expansion = set(mine)
        for candidate in mine:  # Eq. 6
            theirs = reciprocal(candidate, round(k1 / 2))
            if 3 * len(set(theirs) & set(mine)) > 2 * len(theirs):
                expansion |= set(theirs)
        members = np.array(sorted(expansion))
        weights = np.exp(-dt[i, members])  # Eq. 7
        total = 0.0
        for weight in weights:
            total += weight
        v[i, members] = weights / total
    expanded = np.zeros_like(v)
    for i in range(n):  # Eq. 10
        group = sorted(rank[i][:k2])
        total = np.zeros(n)
        for j in group:
            total = total + v[j]
        expanded[i] = total / len(group)
    final = np.empty((len(query_rows), len(gallery_rows)))
    for a, p in enumerate(query_rows):  # Eqs. 9, 11, 12
        shared = np.zeros(len(gallery_rows))
        for j in np.flatnonzero(expanded[p]):
            for b, g in enumerate(gallery_rows):
                if expanded[g, j] != 0:
                    shared[b] += min(expanded[p, j], expanded[g, j])
        jaccard = 1.0 - shared / (2.0 - shared)
        final[a] = jaccard * (1.0 - lam) + dt[p, gallery_rows] * lam
    return final


def ranking(distances: np.ndarray, own: np.ndarray | None = None) -> list[list[int]]:
    """Each row's gallery positions by (distance asc, position asc), its own position left out."""
    out = []
    for i, row in enumerate(distances):
        keep = [g for g in range(len(row)) if own is None or g != own[i]]
        out.append(sorted(keep, key=lambda g: (row[g], g)))
    return out


def reference_metrics(ranks: list[list[int]], query_labels, gallery_labels, recall_at) -> dict[str, float]:
    """Recall@K, MAP@R and R-precision of explicit rankings (queries without a match left out)."""
    hits = {k: [] for k in recall_at}
    ap, rp = [], []
    for ranked, label in zip(ranks, query_labels, strict=True):
        relevant = [gallery_labels[g] == label for g in ranked]
        r = sum(relevant)
        if r == 0:
            continue
        for k in recall_at:
            hits[k].append(any(relevant[:k]))
        found, precisions = 0, 0.0
        for i, rel in enumerate(relevant[:r], 1):
            if rel:
                found += 1
                precisions += found / i
        ap.append(precisions / r)
        rp.append(found / r)
    return {**{f"recall@{k}": float(np.mean(hits[k])) for k in recall_at}, "map@r": float(np.mean(ap)),
            "r_precision": float(np.mean(rp))}


def reference_expand(x: np.ndarray, gallery: np.ndarray, n: int, alpha: float, own=None) -> np.ndarray:
    """αQE of each row of ``x`` over its ``n`` nearest gallery rows (its own left out), with a loop."""
    x, gallery = x.astype(np.float64), gallery.astype(np.float64)
    out = np.empty_like(x)
    for i, vector in enumerate(x):
        s = gallery @ vector
        order = sorted((j for j in range(len(gallery)) if own is None or j != own[i]), key=lambda j: (-s[j], j))
        total = vector.copy()
        for j in order[:n]:
            total += max(s[j], 0.0) ** alpha * gallery[j]
        out[i] = total / np.linalg.norm(total)
    return out


# -- k-reciprocal ---------------------------------------------------------------------------------------------------

@pytest.fixture(params=["every item", "sharing items and the first others"])
def final_path(request, monkeypatch):
    """Both ways of ranking a block by d*: over every gallery item, or over the items sharing V's columns and the
    first k + 1 others in kNN order (``kreciprocal.DENSE_FROM`` chooses by the share of pairs sharing a column)."""
    import deepmetric.evaluation.kreciprocal as kreciprocal

    monkeypatch.setattr(kreciprocal, "DENSE_FROM", 10**9 if request.param == "every item" else 0)
    return request.param


@pytest.mark.parametrize("k1,k2,lam", [(20, 6, 0.3), (4, 3, 0.3), (5, 1, 0.0), (3, 8, 1.0), (60, 2, 0.5)])
def test_k_reciprocal_single_set_equals_the_slow_reference_bitwise(k1, k2, lam, final_path):
    x = dyadic_units(40, seed=k1 + k2)
    settings = KReciprocal(k1=k1, k2=k2, lambda_value=lam)
    expected = reference_k_reciprocal(x, range(40), range(40), k1, k2, lam)
    own = np.arange(40)
    xt = torch.from_numpy(x)
    blocks = list(k_reciprocal_knn(xt, xt, 39, torch.arange(40), settings))
    values = torch.cat([b[1] for b in blocks]).numpy()
    indices = torch.cat([b[2] for b in blocks]).numpy()
    assert indices.tolist() == ranking(expected, own)
    assert np.array_equal(-values, np.take_along_axis(expected, indices, axis=1))  # bitwise


@pytest.mark.parametrize("k1,k2,lam,k", [(3, 1, 1.0, 2), (2, 1, 0.5, 2), (1, 1, 1.0, 1), (5, 3, 0.0, 4)])
def test_a_short_ranking_takes_the_kth_ties_from_the_whole_gallery(k1, k2, lam, k, monkeypatch, final_path):
    # d* is computed for the items sharing V's columns and the first k + 1 others in kNN order; where the last of
    # those ties the k-th value (ties are everywhere here), the row is ranked over the whole gallery
    import deepmetric.evaluation.kreciprocal as kreciprocal

    whole_rows = []
    final_distance = kreciprocal._final_distance

    def counting(shared, *args):
        whole_rows.extend([1] if shared.ndim == 1 else [])  # one query's row over the whole gallery
        return final_distance(shared, *args)

    monkeypatch.setattr(kreciprocal, "_final_distance", counting)
    for seed in range(3):
        x = dyadic_units(40, seed=seed)
        expected = reference_k_reciprocal(x, range(40), range(40), k1, k2, lam)
        blocks = list(k_reciprocal_knn(torch.from_numpy(x), torch.from_numpy(x), k, torch.arange(40),
                                       KReciprocal(k1=k1, k2=k2, lambda_value=lam)))
        indices = torch.cat([b[2] for b in blocks]).numpy()
        assert indices.tolist() == [ranked[:k] for ranked in ranking(expected, np.arange(40))]
    assert whole_rows or lam == 0.0 or final_path == "every item"  # by index (λ = 0) no row needs it


@pytest.mark.parametrize("n_query", [1, 7])
def test_k_reciprocal_query_gallery_sets_queries_first_and_removes_nothing(n_query, final_path):
    x = dyadic_units(36, seed=3)
    query, gallery = x[:n_query], x[n_query:]
    settings = KReciprocal(k1=6, k2=3)
    expected = reference_k_reciprocal(x, range(n_query), range(n_query, 36), 6, 3, 0.3)
    blocks = list(k_reciprocal_knn(torch.from_numpy(query), torch.from_numpy(gallery), 36 - n_query, None,
                                   settings))
    indices = torch.cat([b[2] for b in blocks]).numpy()
    assert indices.tolist() == ranking(expected)


def test_queries_partly_in_the_gallery_join_the_set_once(final_path):
    # rows 0-4 are queries only, rows 5-29 gallery only, rows 30-35 both: the set is the 5 outside, then the gallery
    x = dyadic_units(36, seed=5)
    query = np.concatenate([x[:5], x[30:]])
    gallery = x[5:]
    own = np.array([-1] * 5 + list(range(25, 31)))
    expected = reference_k_reciprocal(x, list(range(5)) + list(range(30, 36)), range(5, 36), 8, 4, 0.3)
    blocks = list(k_reciprocal_knn(torch.from_numpy(query), torch.from_numpy(gallery), 30, torch.from_numpy(own),
                                   KReciprocal(k1=8, k2=4)))
    indices = torch.cat([b[2] for b in blocks]).numpy()
    assert indices.tolist() == [ranked[:30] for ranked in ranking(expected, own)]


def test_k_reciprocal_metrics_equal_the_reference_rankings_metrics():
    x = dyadic_units(48, seed=11)
    labels = np.repeat(np.arange(12), 4)
    ranks = ranking(reference_k_reciprocal(x, range(48), range(48), 5, 3, 0.3), np.arange(48))
    expected = reference_metrics(ranks, labels, labels, (1, 2, 4))
    got = retrieval_metrics(x, labels, recall_at=(1, 2, 4), nmi=False, rerank=KReciprocal(k1=5, k2=3))
    assert got == pytest.approx(expected, abs=1e-6)


def test_blocks_and_budgets_do_not_change_the_ranking():
    x = torch.from_numpy(dyadic_units(50, seed=2))
    settings = KReciprocal(k1=7, k2=4)
    graph = neighbour_graph(x, 7, memory_mb=1e-4)  # one row per block
    assert np.array_equal(graph.lists, neighbour_graph(x, 7).lists)
    v = encode_all(graph, x, settings)
    rows = np.arange(50)

    def sims(start, stop):
        return x[start:stop] @ x.t()

    runs = [list(reranked_blocks(v, rows, rows, graph.row_max_distance(), sims, 10, settings, rows, **budget))
            for budget in ({}, {"memory_mb": 1e-4}, {"pair_budget": 1})]
    assert len(runs[0]) == 1 and len(runs[1]) == len(runs[2]) == 50  # one block; one query a block
    for other in runs[1:]:
        assert torch.equal(torch.cat([b[2] for b in other]), torch.cat([b[2] for b in runs[0]]))
        assert torch.equal(torch.cat([b[1] for b in other]), torch.cat([b[1] for b in runs[0]]))


def test_k_reciprocal_search_answers_each_query_alone(final_path):
    x = dyadic_units(33, seed=7)
    queries, gallery = x[:3], x[3:]
    settings = KReciprocal(k1=6, k2=3)
    scores, ids = k_reciprocal_search(torch.from_numpy(queries), torch.from_numpy(gallery), 5, settings)
    for q in range(3):
        alone = np.concatenate([queries[q:q + 1], gallery])
        expected = reference_k_reciprocal(alone, [0], range(1, 31), 6, 3, 0.3)[0]
        order = ranking(expected[None])[0][:5]
        assert ids[q].tolist() == order
        assert np.array_equal(scores[q], 1.0 - expected[order])
    # the same answers one query at a time
    one = k_reciprocal_search(torch.from_numpy(queries[1:2]), torch.from_numpy(gallery), 5, settings)
    assert np.array_equal(one[1][0], ids[1]) and np.array_equal(one[0][0], scores[1])


def test_k_reciprocal_on_random_floats_ranks_as_the_reference(final_path):
    # generic float32 embeddings (no ties): the reference's float64 similarities differ from the float32 products in
    # the last bits, so d* agrees to 1e-6 and the rankings exactly (no two d* of a row are that close here)
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(10), 5)
    x = (rng.normal(size=(50, 8)) + 2 * rng.normal(size=(10, 8))[labels]).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    expected = reference_k_reciprocal(x, range(50), range(50), 6, 3, 0.3)
    blocks = list(k_reciprocal_knn(torch.from_numpy(x), torch.from_numpy(x), 49, torch.arange(50),
                                   KReciprocal(k1=6, k2=3)))
    values, indices = torch.cat([b[1] for b in blocks]).numpy(), torch.cat([b[2] for b in blocks]).numpy()
    assert indices.tolist() == ranking(expected, np.arange(50))
    assert np.allclose(-values, np.take_along_axis(expected, indices, axis=1), atol=1e-6)


def test_k_reciprocal_helps_where_neighbourhoods_agree():
    # two tight clusters of a class bridged by a hub of another class: plain R@1 misses, re-ranking recovers some
    rng = np.random.default_rng(1)
    labels = np.repeat(np.arange(20), 5)
    x = (rng.normal(size=(100, 16)) * 0.9 + rng.normal(size=(20, 16))[labels]).astype(np.float32)
    plain = retrieval_metrics(x, labels, nmi=False)
    reranked = retrieval_metrics(x, labels, nmi=False, rerank="k-reciprocal")
    assert reranked["map@r"] > plain["map@r"]


# -- αQE and DBA ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("alpha", [0.0, 1.0, 3.0, 2.5])
def test_expansion_equals_the_loop_with_ties_and_negative_similarities(alpha):
    x = dyadic_units(30, seed=4)
    own = np.arange(30)
    got = expand(torch.from_numpy(x), torch.from_numpy(x), 5, alpha, torch.from_numpy(own)).numpy()
    assert np.allclose(got, reference_expand(x, x, 5, alpha, own), atol=1e-6)
    got = expand(torch.from_numpy(x[:4]), torch.from_numpy(x[4:]), 3, alpha).numpy()
    assert np.allclose(got, reference_expand(x[:4], x[4:], 3, alpha), atol=1e-6)


def test_dba_then_qe_metrics_equal_the_references():
    rng = np.random.default_rng(3)
    labels = np.repeat(np.arange(12), 4)
    x = (rng.normal(size=(48, 8)) + 1.5 * rng.normal(size=(12, 8))[labels]).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    own = np.arange(48)
    gallery = reference_expand(x, x, 4, 3.0, own)  # DBA
    query = reference_expand(x, gallery, 3, 3.0, own)  # αQE against the augmented gallery
    ranks = ranking(-(query @ gallery.T), own)
    settings = QueryExpansion(qe_n=3, dba_n=4, alpha=3.0)
    assert settings.method == "dba+qe"
    got = retrieval_metrics(x, labels, recall_at=(1, 2, 4), nmi=False, rerank=settings)
    assert got == pytest.approx(reference_metrics(ranks, labels, labels, (1, 2, 4)), abs=1e-6)
    q, g = expanded_embeddings(torch.from_numpy(x), torch.from_numpy(x), torch.from_numpy(own), settings)
    assert np.allclose(q.numpy(), query, atol=1e-6) and np.allclose(g.numpy(), gallery, atol=1e-6)


def test_qe_search_expands_each_query_against_the_gallery():
    # generic floats: an expanded query's exact ties (which dyadic vectors make) are decided by float rounding
    x = np.random.default_rng(9).normal(size=(30, 8)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    scores, ids = reranked_search(torch.from_numpy(x[:3]), torch.from_numpy(x[3:]), 4, QueryExpansion(qe_n=2))
    query = reference_expand(x[:3], x[3:], 2, 3.0)
    s = query @ x[3:].astype(np.float64).T
    for q in range(3):
        assert ids[q].tolist() == ranking(-s[q:q + 1])[0][:4]
        assert np.allclose(scores[q], s[q, ids[q]], atol=1e-6)


def test_reranked_knn_blocks_have_iter_knn_s_shape():
    x = torch.nn.functional.normalize(torch.randn(20, 6, generator=torch.Generator().manual_seed(0)), dim=1)
    for settings in (KReciprocal(k1=4), QueryExpansion(qe_n=2, dba_n=2)):
        blocks = list(reranked_knn(x, x, 5, torch.arange(20), settings))
        indices = torch.cat([b[2] for b in blocks])
        assert indices.shape == (20, 5) and not (indices == torch.arange(20)[:, None]).any()


# -- settings and the bound -----------------------------------------------------------------------------------------

def test_settings_are_checked_and_named():
    assert rerank_settings("k-reciprocal") == KReciprocal(20, 6, 0.3)
    assert rerank_settings("dba").method == "dba" and rerank_settings("dba", alpha=1.0).alpha == 1.0
    assert rerank_settings("qe", qe_n=3) == QueryExpansion(qe_n=3, dba_n=0)
    assert as_rerank("dba+qe") == QueryExpansion(qe_n=10, dba_n=10)
    with pytest.raises(DeepMetricError, match="takes no k1 .it goes with k-reciprocal"):
        rerank_settings("qe", k1=5)
    with pytest.raises(DeepMetricError, match="takes no qe_n"):
        rerank_settings("dba", qe_n=5)
    with pytest.raises(DeepMetricError, match="one of k-reciprocal, qe, dba, dba.qe"):
        rerank_settings("kreciprocal")
    with pytest.raises(DeepMetricError, match="k1 must be a whole number >= 1"):
        KReciprocal(k1=0)
    with pytest.raises(DeepMetricError, match="lambda must be a number from 0 to 1"):
        KReciprocal(lambda_value=1.5)
    with pytest.raises(DeepMetricError, match="re-ranks nothing"):
        QueryExpansion(qe_n=0, dba_n=0)
    with pytest.raises(DeepMetricError, match="rerank must be None"):
        as_rerank(3)
    assert KReciprocal().to_dict() == {"method": "k-reciprocal", "k1": 20, "k2": 6, "lambda_value": 0.3}


def test_beyond_the_bound_is_one_message_naming_the_option_that_raises_it(monkeypatch):
    x = dyadic_units(30)
    labels = np.repeat(np.arange(10), 3)
    for settings in (KReciprocal(max_items=29), QueryExpansion(dba_n=3, max_items=29)):
        with pytest.raises(DeepMetricError, match=r"30 .*more than its bound of 29.*--rerank-max-items"):
            retrieval_metrics(x, labels, nmi=False, rerank=settings)
    retrieval_metrics(x, labels, nmi=False, rerank=QueryExpansion(qe_n=3, max_items=2))  # αQE alone: no pairs
    with pytest.raises(DeepMetricError, match="31 gallery items and the query"):
        reranked_search(torch.from_numpy(x[:1]), torch.from_numpy(x), 3, KReciprocal(max_items=30))
    # the defaults: an evaluation's bound, and a lower one for a search, which relates the gallery at every call
    import deepmetric.evaluation.rerank as rerank

    monkeypatch.setattr(rerank, "MAX_ITEMS", 29)
    monkeypatch.setattr(rerank, "MAX_SEARCH_ITEMS", 10)
    with pytest.raises(DeepMetricError, match=r"the 30 queries and gallery items, more than its bound of 29: "):
        retrieval_metrics(x, labels, nmi=False, rerank="k-reciprocal")
    with pytest.raises(DeepMetricError, match=r"the 11 gallery items, more than its bound of 10 for a search"):
        reranked_search(torch.from_numpy(x[:1]), torch.from_numpy(x[:11]), 3, rerank_settings("dba"))
    reranked_search(torch.from_numpy(x[:1]), torch.from_numpy(x[:9]), 3, rerank_settings("k-reciprocal"))


# -- the command line and the Python index --------------------------------------------------------------------------

def cli(capsys, *argv):
    from deepmetric.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_metrics_command_re_ranks_as_the_library_and_refuses_stray_options(tmp_path, capsys):
    import json

    x = dyadic_units(48, seed=1)
    labels = np.repeat(np.arange(12), 4)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", labels)
    code, out, err = cli(capsys, "metrics", tmp_path / "x.npy", tmp_path / "y.npy", "--rerank", "k-reciprocal",
                         "--k1", 5, "--k2", 2, "--lambda", 0.5, "--json", "--no-nmi")
    assert code == 0, err
    expected = retrieval_metrics(x, labels, nmi=False, rerank=KReciprocal(k1=5, k2=2, lambda_value=0.5))
    assert json.loads(out) == expected
    code, out, err = cli(capsys, "metrics", tmp_path / "x.npy", tmp_path / "y.npy", "--rerank", "dba+qe",
                         "--qe-n", 3, "--dba-n", 2, "--alpha", 1, "--json", "--no-nmi")
    assert code == 0 and json.loads(out) == retrieval_metrics(x, labels, nmi=False, rerank=QueryExpansion(3, 2, 1.0))
    for argv, message in [(["--k1", 5], "error: --k1 is an option of re-ranking: give --rerank too"),
                          (["--rerank", "qe", "--lambda", 0.2], "error: --rerank qe takes no --lambda (its options: "
                                                                 "--qe-n --alpha)"),
                          (["--rerank", "k-reciprocal", "--rerank-max-items", 47],
                           "more than its bound of 47: its time grows as the square of the items")]:
        code, out, err = cli(capsys, "metrics", tmp_path / "x.npy", tmp_path / "y.npy", *argv)
        assert code == 2 and out == "" and err.startswith("error: ") and message in err
        assert len(err.strip().splitlines()) == 1


def test_search_and_index_re_rank_each_query_against_the_whole_index(tiny_run, tmp_path, capsys):
    import json

    from deepmetric import Index, load_run
    from serve_helpers import make_gallery

    files = make_gallery(tmp_path / "gallery", 12)
    index = tmp_path / "index"
    assert cli(capsys, "index", tiny_run, "--images", tmp_path / "gallery", "--out", index, "--quiet")[0] == 0
    opened = Index.open(index, run=load_run(tiny_run, device="cpu"))
    gallery = torch.from_numpy(opened.embeddings)
    for argv, settings in [(["--rerank", "k-reciprocal", "--k1", 4, "--k2", 2], KReciprocal(k1=4, k2=2)),
                           (["--rerank", "qe", "--qe-n", 2], QueryExpansion(qe_n=2))]:
        code, out, err = cli(capsys, "search", index, "--image", files[3], "--k", 5, "--json", *argv)
        assert code == 0, err
        hits = json.loads(out)["results"]
        query = torch.from_numpy(opened.run.embed([files[3]]))
        scores, ids = reranked_search(query, gallery, 5, settings)
        assert [h["id"] for h in hits] == ids[0].tolist()
        assert [h["score"] for h in hits] == pytest.approx(scores[0].tolist(), abs=1e-6)
        python = opened.search(files[3], k=5, rerank=settings)[0]
        assert [(h.id, h.score) for h in python] == [(h["id"], pytest.approx(h["score"], abs=1e-6)) for h in hits]
    code, _, err = cli(capsys, "search", index, "--image", files[3], "--alpha", 2)
    assert code == 2 and "error: --alpha is an option of re-ranking" in err


def test_evaluate_writes_the_re_ranked_record_beside_the_runs_own(tiny_run, tmp_path, capsys):
    import json
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    assert cli(capsys, "evaluate", run, "--quiet")[0] == 0
    own = (run / "metrics.json").read_bytes()
    code, out, err = cli(capsys, "evaluate", run, "--rerank", "k-reciprocal", "--k1", 6, "--quiet")
    assert code == 0, err
    assert (run / "metrics.json").read_bytes() == own  # the run's record untouched
    record = json.loads((run / "metrics-rerank-k-reciprocal.json").read_text())
    assert record["rerank"] == {"method": "k-reciprocal", "k1": 6, "k2": 6, "lambda_value": 0.3}
    plain = json.loads(own)["metrics"]
    assert record["without_rerank"] == plain  # the same checkpoint's ranking without it
    assert (run / "per-query-rerank-k-reciprocal.npz").is_file()
    lines = out.splitlines()
    assert lines[-2].startswith("trained (last, step 2) ") and lines[-1].startswith("trained (last, step 2) + k-rec")
    code, _, err = cli(capsys, "evaluate", run, "--rerank", "dba", "--all-embeddings")
    assert code == 2 and "leave out --all-embeddings" in err
