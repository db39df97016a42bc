"""Retrieval metrics: hand-computed cases, ties and duplicates, blocked kNN, and pytorch-metric-learning."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from deepmetric.errors import DeepMetricError
from deepmetric.evaluation import retrieval_metrics
from deepmetric.evaluation import topk as topk_module
from deepmetric.evaluation.knn import knn
from deepmetric.evaluation.metrics import compute_metrics
from deepmetric.evaluation.topk import grouped_topk, topk_stable


def angles(*degrees):
    """Unit vectors in 2-D at the given angles: cosine similarity falls with angular distance."""
    rad = np.deg2rad(np.array(degrees, dtype=np.float64))
    return np.stack([np.cos(rad), np.sin(rad)], axis=1)


def test_hand_computed_recall_map_r_precision():
    # Points on a circle; class 0 at 0, 10, 50 degrees, class 1 at 20, 30 degrees.
    x = angles(0, 10, 50, 20, 30)
    y = np.array([0, 0, 0, 1, 1])
    # Rankings (own row removed), nearest first:
    #   q0 (0):   10(0) 20(1) 30(1) 50(0)   R=2: hits at ranks 1, 4
    #   q1 (10):  0(0)|20(1) tie at 10 deg -> lower index first: 0(0), 20(1), 30(1), 50(0); hits 1, 4
    #   q2 (50):  30(1) 20(1) 10(0) 0(0)    hits at 3, 4
    #   q3 (20):  10 | 30 tie -> 10(0) is index 1, 30(1) is index 4 -> 10(0), 30(1), 0(0), 50(0); R=1 hit at 2
    #   q4 (30):  20(1), 10|50 ... R=1 hit at 1
    m = retrieval_metrics(x, y, recall_at=(1, 2, 4), nmi=False)
    assert m["recall@1"] == pytest.approx(3 / 5)  # q0, q1, q4
    assert m["recall@2"] == pytest.approx(4 / 5)  # + q3
    assert m["recall@4"] == pytest.approx(1.0)
    # MAP@R: q0: (1/2)(1) = .5; q1: .5; q2: 0; q3 (R=1): 0; q4: 1
    assert m["map@r"] == pytest.approx((0.5 + 0.5 + 0 + 0 + 1) / 5)
    # R-precision: q0 1/2, q1 1/2, q2 0, q3 0, q4 1
    assert m["r_precision"] == pytest.approx((0.5 + 0.5 + 0 + 0 + 1) / 5)


def test_ties_are_broken_by_gallery_index_whatever_the_block_size():
    # Query 0 has two gallery items at exactly the same similarity: index 1 (other class) and 2 (same).
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, -1.0], [-1.0, 0.0]])
    y = torch.tensor([0, 1, 0, 1])
    m = retrieval_metrics(x, y, recall_at=(1, 2), nmi=False)
    # q0: items 1 and 2 tie at s=0 -> 1 (wrong) first -> miss at 1, hit at 2.
    # q1: 0 and 3 tie -> 0 (wrong) then 3 (right). q2: 0 (right) and 3 tie -> 0 first -> hit.
    # q3: 1 and 2 tie -> 1 (right) -> hit.
    assert m["recall@1"] == pytest.approx(2 / 4)
    assert m["recall@2"] == pytest.approx(1.0)
    for memory in (1e-6, 1.0, 256.0):  # one query per block ... everything in one block
        _, idx = knn(torch.nn.functional.normalize(x, dim=1), x, 3, torch.arange(4), memory_mb=memory)
        assert idx[0].tolist() == [1, 2, 3]


def test_topk_stable_fixes_ties_at_the_boundary():
    sims = torch.tensor([[0.5, 0.75, 0.5, 0.5, 0.25, 0.5]])
    values, indices = topk_stable(sims, 3)
    assert indices.tolist() == [[1, 0, 2]] and values.tolist() == [[0.75, 0.5, 0.5]]


@pytest.mark.parametrize("on_host", [True, False])  # numpy's selection or torch's, whichever this CPU would take
@pytest.mark.parametrize("levels", [3, 20, 1000, None])  # heavy ties ... no ties
@pytest.mark.parametrize("k,n", [(3, 61), (3, 203), (10, 173), (10, 1001)])
def test_topk_stable_equals_a_stable_full_sort_on_wide_rows(levels, k, n, on_host, monkeypatch):
    # n >= 2 * GROUP * (k + 1) takes the grouped selection (with n % GROUP leftover columns); the others the
    # whole-row path; both must give exactly the stable sort's first k
    monkeypatch.setattr(topk_module, "numpy_selects_fast", lambda: on_host)
    generator = torch.Generator().manual_seed(k * n)
    sims = torch.rand(64, n, generator=generator)
    if levels is not None:
        sims = (sims * levels).floor() / levels
    sims[0, :] = 0.5  # a row of one value
    sims[1, ::7] = 1.0  # the best values spread over the groups
    values, indices = topk_stable(sims, k)
    expected_values, expected_indices = torch.sort(sims, dim=1, descending=True, stable=True)
    assert torch.equal(indices, expected_indices[:, :k])
    assert torch.equal(values, expected_values[:, :k])


@pytest.mark.parametrize("levels", [4, 1000, None])
@pytest.mark.parametrize("k,n", [(1, 37), (5, 101), (40, 1000), (40, 997)])
def test_the_host_selection_keeps_what_torchs_keeps(levels, k, n):
    """``grouped_topk_on_host`` (numpy's selections) against ``grouped_topk`` (torch's): the same values, the same
    columns for each value, the same unsure rows, with ties, -inf (a query's own row), NaN (the largest for both, as
    torch's ``topk`` counts it) and leftover columns (n % GROUP)."""
    generator = torch.Generator().manual_seed(k + n)
    sims = torch.rand(48, n, generator=generator)
    if levels is not None:
        sims = (sims * levels).floor() / levels
    sims[torch.arange(48), torch.arange(48) % n] = float("-inf")
    sims[2, 5] = sims[3, n - 1] = float("nan")  # in a group, and among the leftover columns
    sims[5, 7] = -float("nan")  # x86's own NaN has its sign bit set
    sims[6, ::3] = -0.0  # equal to 0.0, by index among them
    sims[6, 1::3] = 0.0
    sims[4, :] = 0.5
    host, device_kind = topk_module.grouped_topk_on_host(sims, k), topk_module.grouped_topk(sims, k)
    assert torch.equal(host[2], device_kind[2]) and host[2].dtype == torch.bool
    sure = (~host[2]).nonzero().squeeze(1).tolist()
    if levels is None:  # distinct values: every row but the flat one is vouched for, NaN rows included
        assert sure == [row for row in range(48) if row != 4]
        assert host[0][2, 0].isnan() and host[1][2, 0] == 5 and host[1][3, 0] == n - 1
    stable = torch.sort(sims.nan_to_num(2.0), dim=1, descending=True, stable=True).indices[:, :k]
    for row in sure:
        assert torch.equal(host[1][row], stable[row])  # already in topk_stable's order: ties by index
        assert torch.equal(host[0][row].nan_to_num(2.0), device_kind[0][row].nan_to_num(2.0))
        # equal values may come in any order: the same columns, and each column with its own value
        assert sorted(host[1][row].tolist()) == sorted(device_kind[1][row].tolist())
        assert torch.equal(sims[row, host[1][row]].nan_to_num(2.0), host[0][row].nan_to_num(2.0))


def test_the_host_selections_keys_order_by_value_then_by_index_and_put_every_nan_first():
    """``_order_keys``: one sort of the keys, read backwards, is the order of a stable sort by decreasing value, for
    negatives, both zeros (equal, so by index), infinities, subnormals and NaN of either sign (the largest)."""
    special = [0.0, -0.0, float("inf"), float("-inf"), 1e-45, -1e-45, 3.4e38, -3.4e38, 0.5, -0.5]
    rng = np.random.default_rng(3)
    values = np.concatenate([np.array(special * 3, dtype=np.float32), rng.normal(size=60).astype(np.float32)])
    values = np.concatenate([values, np.array([np.nan, -np.nan], dtype=np.float32)])
    assert np.signbit(values[-1]) and not np.signbit(values[-2])
    rng.shuffle(values)
    columns = rng.permutation(len(values)).astype(np.int64) * 1000 + 2**31  # columns past 2^31, below 2^32
    keys = topk_module._order_keys(values[None], columns[None])[0]
    order = np.argsort(keys)[::-1]
    expected = sorted(range(len(values)), key=lambda i: (not np.isnan(values[i]),
                                                          -(0.0 if np.isnan(values[i]) else float(values[i])),
                                                          columns[i]))
    assert order.tolist() == expected


@pytest.mark.parametrize("fast", [True, False])
def test_topk_stable_selects_on_the_host_exactly_where_numpy_is_fast(fast, monkeypatch):
    """A CPU tensor goes to numpy's selection where ``numpy_selects_fast`` says so and to torch's otherwise (both
    exact: only the speed tells them apart, so this asks which one ran)."""
    ran = []
    for name in ("grouped_topk", "grouped_topk_on_host"):
        selection = getattr(topk_module, name)
        monkeypatch.setattr(topk_module, name, lambda sims, k, selection=selection, name=name:
                            ran.append(name) or selection(sims, k))
    monkeypatch.setattr(topk_module, "numpy_selects_fast", lambda: fast)
    topk_module.topk_stable(torch.rand(3, 200), 5)
    assert ran == ["grouped_topk_on_host" if fast else "grouped_topk"]


def test_the_host_selection_is_taken_only_where_numpy_selects_with_simd(monkeypatch):
    """numpy >= 2 on x86 with AVX2 in its dispatch: numpy 1.26's ``argpartition`` and a CPU without AVX2 were 6 times
    slower than with it (docs/benchmarks/evaluation.md), and ARM is not measured."""
    rule, features = topk_module.numpy_selects_fast.__wrapped__, {"X86_V3": True}
    monkeypatch.setattr(topk_module, "_numpy_cpu_features", lambda: features)
    monkeypatch.setattr(topk_module.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(topk_module.np, "__version__", "2.4.6")
    assert rule()
    features["X86_V3"] = False  # NPY_DISABLE_CPU_FEATURES=X86_V3, or no AVX2
    assert not rule()
    features.clear()
    features["AVX2"] = True  # numpy 2.0 to 2.3 name the feature AVX2
    assert rule()
    features.clear()  # no table where it is looked for
    assert not rule()
    features["AVX2"] = True
    monkeypatch.setattr(topk_module.np, "__version__", "1.26.4")
    assert not rule()
    monkeypatch.setattr(topk_module.np, "__version__", "2.4.6")
    monkeypatch.setattr(topk_module.platform, "machine", lambda: "aarch64")
    assert not rule()
    monkeypatch.undo()
    table = topk_module._numpy_cpu_features()  # numpy's own table: every numpy 2 has one, 1.26 elsewhere
    assert isinstance(table, dict) and (bool(table) or int(np.__version__.split(".")[0]) < 2)


def test_own_row_is_removed_by_index_not_by_position():
    # Row 1 duplicates row 0 exactly but belongs to another class. Removing "the first neighbour"
    # could drop row 1 instead of row 0 itself; removal by index keeps row 1 as q0's nearest neighbour.
    x = angles(0, 0, 90, 100)
    y = np.array([0, 1, 0, 1])
    m = retrieval_metrics(x, y, recall_at=(1,), nmi=False)
    # q0 -> 1 (wrong); q1 -> 0 (wrong); q2 -> 3 (wrong); q3 -> 2 (wrong)
    assert m["recall@1"] == 0.0


def test_duplicates_of_the_same_class_are_found():
    x = angles(0, 0, 90, 90)
    y = np.array([0, 0, 1, 1])
    m = retrieval_metrics(x, y, recall_at=(1,), nmi=False)
    assert m["recall@1"] == 1.0 and m["map@r"] == 1.0 and m["r_precision"] == 1.0


def test_query_gallery_protocol_does_not_remove_anything():
    query = angles(0, 90)
    gallery = angles(0, 5, 90, 95)
    m = retrieval_metrics(query, [0, 1], gallery, [1, 0, 0, 1], recall_at=(1, 2), nmi=False)
    # q0 (0 deg, class 0): gallery at 0 (class 1), 5 (0), 90 (0), 95 (1): hits at ranks 2, 3.
    # q1 (90 deg, class 1): 90 (0), 95 (1), 5 (0), 0 (1): hits at ranks 2, 4. Nothing is removed.
    assert m["recall@1"] == 0.0 and m["recall@2"] == 1.0
    assert m["map@r"] == pytest.approx(0.25)  # R=2: hits at ranks 2 and 3 -> (1/2)(0 + 1/2) = .25 each


def test_queries_without_a_match_are_left_out():
    x = angles(0, 10, 90)
    m = retrieval_metrics(x, [0, 0, 1], recall_at=(1,), nmi=False)  # class 1 has one image
    assert m["recall@1"] == 1.0


def test_blocked_knn_equals_brute_force_up_to_float32_rounding():
    """Any block size returns the true top-10 in order. Float32 products of different block shapes may differ in
    the last bit (BLAS picks other kernels), so neighbours closer than that may swap: compare in float64."""
    g = torch.Generator().manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(300, 12, generator=g), dim=1)
    exact = x.double() @ x.double().t()
    exact.fill_diagonal_(float("-inf"))
    true_top = torch.sort(exact, dim=1, descending=True).values[:, :10]
    for memory in (0.01, 0.1, 100.0):
        _, idx = knn(x, x, 10, torch.arange(300), memory_mb=memory)
        assert (idx != torch.arange(300)[:, None]).all()
        assert torch.allclose(exact.gather(1, idx), true_top, rtol=0, atol=1e-6)


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_the_cpu_engines_write_every_block_into_one_buffer_and_return_nothing_of_it(engine, monkeypatch):
    """One block's memory serves every block (the last, shorter one its first rows), and the neighbours are those of
    products into new memory block by block: no block's results are overwritten by the next's. (The torch engine
    on one thread; on several, ``test_the_torch_engine_takes_blocks_on_every_thread...``.)"""
    from deepmetric.evaluation import knn as knn_module

    monkeypatch.setattr(knn_module, "knn_workers", lambda: 1)
    x = torch.nn.functional.normalize(torch.randn(301, 12, generator=torch.Generator().manual_seed(4)), dim=1)
    own = torch.arange(301)
    block = knn_module.block_rows_for(301, 0.05)
    assert 301 % block  # a shorter last block
    fresh = [knn_module._product_block(x[s:s + block], x, 10, own[s:s + block], engine)
             for s in range(0, 301, block)]
    written = []
    real = knn_module.similarities
    monkeypatch.setattr(knn_module, "similarities",
                        lambda q, g, engine="torch", out=None: written.append(out) or real(q, g, engine, out))
    values, indices = knn(x, x, 10, own, memory_mb=0.05, engine=engine)
    assert len(written) == len(fresh) and all(out is not None for out in written)
    assert {out.data_ptr() for out in written} == {written[0].data_ptr()}
    assert [len(out) for out in written] == [block] * (len(fresh) - 1) + [301 % block]
    assert torch.equal(values, torch.cat([v for v, _ in fresh]))
    assert torch.equal(indices, torch.cat([i for _, i in fresh]))


def exact_with_ties(n: int, dim: int = 12, seed: int = 5) -> torch.Tensor:
    """Rows of -1, 0 and 1 halves: every product is a multiple of 1/4 below 2^24 of them, exact in float32 whatever
    the kernel, its threads or its order of summation, and equal similarities abound (ties, and -0.0 beside 0.0)."""
    return torch.randint(-1, 2, (n, dim), generator=torch.Generator().manual_seed(seed)).float() / 2


@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("self_index", [False, True])
def test_the_torch_engine_takes_blocks_on_every_thread_and_yields_the_one_threads_neighbours(workers, self_index,
                                                                                                monkeypatch):
    """With several threads, each takes whole blocks of ``memory_mb / workers`` (a product and a selection on one
    thread, into a buffer of its own: block i into buffer i mod workers) and the blocks come back in order, equal
    bit for bit to the loop on one thread and to a stable sort of the whole matrix, ties ordered by index."""
    from deepmetric.evaluation import knn as knn_module

    x = exact_with_ties(301)
    own = torch.arange(301) if self_index else None
    monkeypatch.setattr(knn_module, "knn_workers", lambda: 1)
    one_thread = list(knn_module.iter_knn(x, x, 10, own, memory_mb=0.1))
    written, threads = [], []
    real = knn_module.similarities

    def recording(q, g, engine="torch", out=None):
        written.append(out)
        threads.append((torch.get_num_threads(), knn_module.threading.current_thread().name))
        return real(q, g, engine, out)

    monkeypatch.setattr(knn_module, "similarities", recording)
    monkeypatch.setattr(knn_module, "knn_workers", lambda: workers)
    blocks = list(knn_module.iter_knn(x, x, 10, own, memory_mb=0.1))
    block = knn_module.block_rows_for(301, 0.1 / workers)
    assert [start for start, _, _ in blocks] == list(range(0, 301, block)) and len(blocks) > workers
    assert all(t == 1 and name.startswith("deepmetric-knn") for t, name in threads)
    pointers = [out.data_ptr() for out in written]
    assert len(set(pointers)) == workers and all(p == pointers[i % workers] for i, p in enumerate(pointers))
    values, indices = torch.cat([v for _, v, _ in blocks]), torch.cat([i for _, _, i in blocks])
    assert torch.equal(values, torch.cat([v for _, v, _ in one_thread]))
    assert torch.equal(indices, torch.cat([i for _, _, i in one_thread]))
    sims = x @ x.t()
    if self_index:
        sims.fill_diagonal_(float("-inf"))
    order = torch.sort(sims, dim=1, descending=True, stable=True)
    assert torch.equal(indices, order.indices[:, :10]) and torch.equal(values, order.values[:, :10])


def test_the_threads_kNN_leaves_the_callers_thread_count_and_float32_precision_as_they_were(monkeypatch):
    """The workers' one thread each is theirs alone: the caller's thread count, the count a thread started after
    the kNN gets, and the caller's float32 matmul precision are what they were, also when the caller stops reading
    after the first block (its threads are gone then)."""
    import threading

    from deepmetric.evaluation import knn as knn_module

    monkeypatch.setattr(knn_module, "knn_workers", lambda: 2)
    chosen_threads, chosen_precision = torch.get_num_threads(), torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        x = exact_with_ties(200)
        blocks = knn_module.iter_knn(x, x, 5, memory_mb=0.05)
        next(blocks)
        blocks.close()
        assert not any(t.name.startswith("deepmetric-knn") for t in threading.enumerate())
        assert torch.get_float32_matmul_precision() == "medium"
        assert torch.get_num_threads() == chosen_threads
        later = []
        thread = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
        thread.start()
        thread.join()
        assert later == [chosen_threads]
    finally:
        torch.set_float32_matmul_precision(chosen_precision)


def random_with_ties(n=400, dim=16, classes=25, duplicates=60, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dim)).astype(np.float32)
    y = rng.integers(0, classes, size=n)
    picks = rng.choice(n, duplicates, replace=False)
    x = np.concatenate([x, x[picks]])  # exact duplicates, same label: ties whose order cannot matter
    y = np.concatenate([y, y[picks]])
    return x / np.linalg.norm(x, axis=1, keepdims=True), y


def dot_error_bound(dim: int) -> float:
    """gamma_D = D u / (1 - D u), u = 2^-24: a float32 inner product of two unit D-vectors, summed in any order (any
    kernel, block size, engine or CPU), is within gamma_D of the exact one (Higham, Accuracy and Stability of
    Numerical Algorithms, eq. 3.5)."""
    u = 2.0**-24
    return dim * u / (1 - dim * u)


def smallest_rank_gap(query: torch.Tensor, query_labels, gallery: torch.Tensor | None = None, gallery_labels=None,
                      top: int = 8) -> float:
    """The smallest gap between the exact (float64) similarities of consecutive neighbours among each query's first
    ``top + 1``, exact copies of one label aside (their order changes no metric); ``query`` and ``gallery`` are the
    float32 vectors the engines multiply, the query's own row (no gallery) left out. Above 2 gamma_D no float32
    kernel can rank two of those neighbours otherwise than the exact order does."""
    own = gallery is None
    gallery, gallery_labels = (query, query_labels) if own else (gallery, gallery_labels)
    sims = query.double() @ gallery.double().t()
    if own:
        sims.fill_diagonal_(-float("inf"))
    values, order = sims.sort(dim=1, descending=True)
    values, order = values[:, :top + 1], order[:, :top + 1]
    labels = torch.as_tensor(gallery_labels)[order]
    gaps = values[:, :-1] - values[:, 1:]
    copies = (gaps < 1e-12) & (labels[:, :-1] == labels[:, 1:])
    return float(gaps[~copies].min())


def as_engines_see_it(x: np.ndarray) -> torch.Tensor:
    """``x`` l2-normalised as ``retrieval_metrics`` hands it to the kNN engines."""
    return torch.nn.functional.normalize(torch.as_tensor(x).float(), dim=1)


def test_agrees_with_pytorch_metric_learning_on_random_embeddings_with_ties():
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    x, y = random_with_ties()
    calculator = AccuracyCalculator(include=("precision_at_1", "mean_average_precision_at_r", "r_precision"),
                                    k="max_bin_count")
    reference = calculator.get_accuracy(torch.tensor(x), torch.tensor(y))
    ours = retrieval_metrics(x, y, recall_at=(1,), nmi=False)
    assert ours["recall@1"] == pytest.approx(reference["precision_at_1"], abs=1e-6)
    assert ours["map@r"] == pytest.approx(reference["mean_average_precision_at_r"], abs=1e-6)
    assert ours["r_precision"] == pytest.approx(reference["r_precision"], abs=1e-6)


def test_agrees_with_pytorch_metric_learning_query_vs_gallery():
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    x, y = random_with_ties(seed=1)
    q, ql, g, gl = x[:150], y[:150], x[150:], y[150:]
    calculator = AccuracyCalculator(include=("precision_at_1", "mean_average_precision_at_r", "r_precision"),
                                    k="max_bin_count")
    reference = calculator.get_accuracy(torch.tensor(q), torch.tensor(ql), torch.tensor(g), torch.tensor(gl))
    ours = retrieval_metrics(q, ql, g, gl, recall_at=(1,), nmi=False)
    assert ours["recall@1"] == pytest.approx(reference["precision_at_1"], abs=1e-6)
    assert ours["map@r"] == pytest.approx(reference["mean_average_precision_at_r"], abs=1e-6)
    assert ours["r_precision"] == pytest.approx(reference["r_precision"], abs=1e-6)


def test_recall_at_k_matches_a_slow_loop():
    x, y = random_with_ties(n=120, classes=10, duplicates=10, seed=2)
    ours = retrieval_metrics(x, y, recall_at=(1, 2, 4, 8), nmi=False)
    sims = x @ x.T
    for k in (1, 2, 4, 8):
        hits = 0
        for i in range(len(y)):
            order = sorted((j for j in range(len(y)) if j != i), key=lambda j: (-sims[i, j], j))
            hits += any(y[j] == y[i] for j in order[:k])
        assert ours[f"recall@{k}"] == pytest.approx(hits / len(y))


def test_nmi_is_one_for_separated_clusters_and_keys_are_stable():
    x = np.repeat(np.eye(4), 5, axis=0) + 1e-3 * np.random.default_rng(0).normal(size=(20, 4))
    y = np.repeat(np.arange(4), 5)
    m = retrieval_metrics(x, y)
    assert set(m) == {"recall@1", "recall@2", "recall@4", "recall@8", "map@r", "r_precision", "nmi"}
    assert m["nmi"] == pytest.approx(1.0) and m["recall@1"] == 1.0


def test_bad_inputs_are_named():
    with pytest.raises(DeepMetricError, match="NaN"):
        retrieval_metrics(np.array([[np.nan, 1.0], [1.0, 0.0]]), [0, 0])
    with pytest.raises(DeepMetricError, match="3 entries for 2"):
        retrieval_metrics(np.eye(2), [0, 0, 1])
    with pytest.raises(DeepMetricError, match="nothing to retrieve"):
        retrieval_metrics(np.eye(3), [0, 1, 2])


def test_compute_metrics_is_independent_of_block_memory():
    x, y = random_with_ties(n=200, classes=12, seed=3)
    xt, yt = torch.tensor(x), torch.tensor(y)
    # one block of 200 queries or blocks of a few: the product kernels differ (up to 2.4e-7 here), but == holds on any
    # CPU because the neighbours that decide these metrics (the first max(R, 4)) are further apart than any
    # float32 summation order can move their similarities (2.07e-6 against 1.91e-6)
    assert smallest_rank_gap(xt, yt, top=max(4, int(np.bincount(y).max()))) > 2 * dot_error_bound(16)
    a = compute_metrics(xt, yt, xt, yt, torch.arange(len(y)), (1, 4), nmi=False, memory_mb=0.01)
    b = compute_metrics(xt, yt, xt, yt, torch.arange(len(y)), (1, 4), nmi=False, memory_mb=500)
    assert a == b


def needs(engine):
    if engine == "faiss":
        pytest.importorskip("faiss")
    if engine == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


@pytest.mark.parametrize("engine", ["numpy", "faiss", "cuda"])
@pytest.mark.parametrize("k", [1, 5, 40])
def test_every_engine_gives_the_torch_engines_neighbours(k, engine):
    needs(engine)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(500, 16, generator=g)
    x[100:140] = x[0]  # 41 exact duplicates: ties that cross any candidate margin
    x[300:303] = x[299]
    x = torch.nn.functional.normalize(x, dim=1)
    # rounded to multiples of 2^-10 (unit vectors to 1e-3): every product and partial sum of two of them is a multiple
    # of 2^-20 below 2 in magnitude, exact in float32, so every engine (faiss re-scores by another product than
    # torch's) computes the same similarities on any CPU, and its neighbours must be the torch engine's to the bit.
    # Unrounded, neighbours 2.2e-7 apart meet products that differ by up to 2.4e-7 between kernels.
    x = torch.round(x * 1024) / 1024
    for self_index in (torch.arange(500), None):
        a = knn(x, x, k, self_index, memory_mb=0.05, engine="torch")
        b = knn(x, x, k, self_index, memory_mb=0.05, engine=engine)
        assert torch.equal(a[1], b[1]) and torch.equal(a[0], b[0])


@pytest.mark.parametrize("k", [1, 5, 40, 300])
def test_the_cuda_engines_queued_blocks_give_the_torch_engines_neighbours_on_the_cpu(k):
    """The ``cuda`` engine's path (``_queued_blocks``: nothing waits inside a block, the rows the grouped selection
    cannot vouch for are redone when the block is read, ties are ordered in every row; rows narrower than the grouped
    selection needs, k = 300, take the whole-row one) run on the CPU, block by block: the torch engine's neighbours to
    the bit, for the gallery as queries, another tensor as queries, and queries of which only some have their own row
    in the gallery."""
    from deepmetric.evaluation import knn as knn_module

    g = torch.Generator().manual_seed(5)
    x = torch.randn(2000, 16, generator=g)
    x[100:141] = x[0]  # 41 exact duplicates: rows whose ties cross the k-th place
    x[1990:] = x[1]  # and 10 in the last block
    x = torch.round(torch.nn.functional.normalize(x, dim=1) * 1024) / 1024  # exact products (see above)
    own = torch.arange(2000)
    block = knn_module.block_rows_for(2000, 0.5)
    if k < 10:  # the redo path runs, in the last block too
        unsure = grouped_topk(knn_module._masked_similarities(x, x, own), k)[2]
        assert unsure[:141].sum() >= 41 and unsure[1990:].all() and 2000 % block < 10  # the last block's are all
    some_own = torch.where(own[:300] % 3 == 0, own[:300], -1)
    cases = [(x, own), (x.clone(), own), (x.clone(), None), (x[:300].clone(), some_own)]
    for query, self_index in cases:
        parts = list(knn_module._queued_blocks(query, x, k, self_index, block, torch.device("cpu")))
        assert [p[0] for p in parts] == list(range(0, len(query), block))
        values, indices = torch.cat([p[1] for p in parts]), torch.cat([p[2] for p in parts])
        expected = knn(query, x, k, self_index, memory_mb=0.5, engine="torch")
        assert torch.equal(indices, expected[1]) and torch.equal(values, expected[0]) and indices.dtype == torch.long


@pytest.mark.parametrize("engine", ["numpy", "faiss", "cuda"])
def test_metrics_are_the_same_with_every_engine(engine):
    needs(engine)
    x, y = random_with_ties(n=300, classes=15, duplicates=40, seed=5)
    # the engines' products differ in the last bits (another BLAS, faiss' re-scoring), but == holds on any CPU: the
    # neighbours that decide the metrics (the first max(R, 8)) are further apart than any float32 summation order
    # can move their similarities (2.4e-6 and 8.5e-6 against 1.9e-6)
    top = max(8, int(np.bincount(y).max()))
    assert smallest_rank_gap(as_engines_see_it(x), y, top=top) > 2 * dot_error_bound(16)
    assert smallest_rank_gap(as_engines_see_it(x[:100]), y[:100], as_engines_see_it(x[100:]), y[100:],
                             top=top) > 2 * dot_error_bound(16)
    a = retrieval_metrics(x, y, recall_at=(1, 2, 4, 8), nmi=False, engine="torch")
    b = retrieval_metrics(x, y, recall_at=(1, 2, 4, 8), nmi=False, engine=engine)
    assert a == b
    q, ql, gx, gl = x[:100], y[:100], x[100:], y[100:]
    assert (retrieval_metrics(q, ql, gx, gl, nmi=False, engine="torch")
            == retrieval_metrics(q, ql, gx, gl, nmi=False, engine=engine))


@pytest.mark.parametrize(("vendor", "family", "model", "mkl", "expected"), [
    ("AuthenticAMD", "26", "2", True, "numpy"),  # Zen 5, measured
    ("AuthenticAMD", "25", "1", True, "numpy"),  # Zen 3, measured
    ("AuthenticAMD", "23", "49", True, "numpy"),  # Zen 2 (model 0x31): full-width AVX2, as Zen 3
    ("AuthenticAMD", "23", "1", True, "torch"),  # Zen 1, measured: MKL's products the faster
    ("AuthenticAMD", "23", "8", True, "torch"),  # Zen+
    ("HygonGenuine", "24", "0", True, "torch"),  # Dhyana, a Zen 1 core
    ("AuthenticAMD", "", "", True, "numpy"),  # no family or model given
    ("GenuineIntel", "6", "85", True, "torch"), ("", "", "", True, "torch"),
    ("AuthenticAMD", "25", "1", False, "torch")])
def test_auto_engine_avoids_mkl_products_on_cpus_not_made_by_intel(monkeypatch, vendor, family, model, mkl,
                                                                     expected):
    import importlib

    knn_module = importlib.import_module("deepmetric.evaluation.knn")
    fields = {"vendor_id": vendor, "cpu family": family, "model": model}
    monkeypatch.setattr(knn_module, "cpu_info", lambda field: fields.get(field, ""))
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: mkl)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert knn_module.resolve_engine("auto") == expected
    assert knn_module.resolve_engine("torch") == "torch"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert knn_module.resolve_engine("auto") == "cuda"  # wherever torch sees a GPU, whatever the CPU


def test_cuda_engine_without_a_gpu_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeepMetricError, match="kNN engine 'cuda' asked for, but torch sees no CUDA device"):
        retrieval_metrics(np.eye(4), [0, 0, 1, 1], nmi=False, engine="cuda")


def test_each_engine_multiplies_with_what_it_names(monkeypatch):
    """``engine`` picks the code that computes the products: faiss' searcher only for 'faiss', numpy's product only
    for 'numpy' (they agree to rounding, so only this test tells them apart); 'faiss' without faiss is one clear
    error, never a silent fallback."""
    import importlib

    knn_module = importlib.import_module("deepmetric.evaluation.knn")
    x = torch.nn.functional.normalize(torch.randn(50, 8, generator=torch.Generator().manual_seed(0)), dim=1)
    tracked = x.clone().requires_grad_()
    assert knn_module.similarities(tracked, x, "torch").grad_fn is not None  # torch's product, in the graph
    assert knn_module.similarities(tracked, x, "numpy").grad_fn is None  # numpy's: outside it
    used = []
    real_searcher, real_similarities = knn_module._FaissSearcher, knn_module.similarities
    monkeypatch.setattr(knn_module, "_FaissSearcher", lambda gallery: used.append("faiss") or real_searcher(gallery))
    monkeypatch.setattr(knn_module, "similarities", lambda q, g, *rest: used.append(rest[:1]) or real_similarities(
        q, g, *rest))
    for engine in ("torch", "numpy") + (("faiss",) if knn_module.faiss_available() else ()):
        used.clear()
        knn(x, x, 3, engine=engine)
        assert used == (["faiss"] if engine == "faiss" else [(engine,)]), (engine, used)
    monkeypatch.setattr(knn_module, "faiss_available", lambda: False)
    with pytest.raises(DeepMetricError, match="kNN engine 'faiss' asked for, but faiss is not installed"):
        knn(x, x, 3, engine="faiss")
    assert knn_module.resolve_engine("torch") == "torch"


def test_the_queued_blocks_redo_unsure_rows_from_the_blocks_own_similarities(monkeypatch):
    """One product per block, none for the redo: a product of the unsure rows alone runs another kernel, whose
    float32 rounding can part two neighbours the block's product had tied (seen at SOP's shape: a row's 100th
    neighbour became another gallery item than the torch engine's)."""
    from deepmetric.evaluation import knn as knn_module

    x = torch.nn.functional.normalize(torch.randn(600, 16, generator=torch.Generator().manual_seed(3)), dim=1)
    x[100:130] = x[0]  # duplicates: unsure rows to redo
    products = []
    real = knn_module._masked_similarities
    monkeypatch.setattr(knn_module, "_masked_similarities", lambda q, *a: products.append(len(q)) or real(q, *a))
    block = knn_module.block_rows_for(600, 0.2)
    own = torch.arange(600)
    assert grouped_topk(real(x, x, own), 5)[2].any()
    parts = list(knn_module._queued_blocks(x, x, 5, own, block, torch.device("cpu")))
    assert products == [len(p[1]) for p in parts]


def test_the_cuda_engine_hands_everything_to_the_queued_blocks_on_the_current_gpu(monkeypatch):
    """``iter_knn`` with the ``cuda`` engine: the queued path (tested on the CPU above) gets the queries, the gallery,
    k, the own rows, the block for the gallery and ``CUDA_BLOCK_SCALE`` times the budget, and this process's GPU
    (faked here: no GPU needed)."""
    from deepmetric.evaluation import knn as knn_module

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(knn_module, "_queued_blocks", lambda *args: calls.append(args) or iter([(0, "v", "i")]))
    query, gallery, own = torch.zeros(5, 4), torch.zeros(3000, 4), torch.arange(5)
    assert list(knn_module.iter_knn(query, gallery, 7, own, memory_mb=2.0, engine="cuda")) == [(0, "v", "i")]
    (args,) = calls
    assert args[0] is query and args[1] is gallery and args[2] == 7 and args[3] is own
    assert knn_module.CUDA_BLOCK_SCALE == 4  # the H200's measurement (knn.py); a change of it is a decision
    assert args[4:] == (knn_module.block_rows_for(3000, 8.0), torch.device("cuda", 1))


@pytest.mark.parametrize("engine", ["torch", "numpy", "cuda"])
def test_the_kernel_products_are_full_float32_and_the_callers_precision_is_restored(engine):
    """TF32 (precision 'high') would move CUDA similarities by about 1e-3: the kNN's products are IEEE float32
    whatever the caller chose, and the caller's choice is back afterwards."""
    needs(engine)
    g = torch.Generator().manual_seed(7)
    x = torch.nn.functional.normalize(torch.randn(300, 64, generator=g), dim=1)
    exact = (x.double() @ x.double().t()).float()
    chosen = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        values, indices = knn(x, x, 10, engine=engine)
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(chosen)
    assert values.device.type == "cpu" and indices.device.type == "cpu"
    # float32 products of unit 64-vectors in any summation order are within gamma_64 = 3.8e-6 of the exact ones (and
    # ``exact`` within u of them): 1e-6 held by the kernels seen so far only (3.7e-7), this holds by the bound;
    # TF32's products miss by up to 2.8e-4 here, 70 times more
    assert torch.allclose(values, exact.gather(1, indices), rtol=0, atol=dot_error_bound(64) + 2.0**-24)


def test_importing_deepmetric_lets_openblas_threads_sleep_unless_the_user_chose():
    """deepmetric sets OPENBLAS_THREAD_TIMEOUT before numpy loads OpenBLAS (deepmetric/openblas.py)."""
    import os
    import subprocess
    import sys

    code = "import os, deepmetric, numpy; print(os.environ['OPENBLAS_THREAD_TIMEOUT'])"
    env = {key: value for key, value in os.environ.items() if key != "OPENBLAS_THREAD_TIMEOUT"}
    for chosen, expected in ((None, "4"), ("20", "20")):
        if chosen:
            env["OPENBLAS_THREAD_TIMEOUT"] = chosen
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert done.stdout.strip() == expected


def test_kmeans_without_faiss_warns_from_the_cluster_count_where_it_is_slow(monkeypatch, caplog):
    from deepmetric.evaluation import metrics

    x = np.random.default_rng(0).normal(size=(40, 4)).astype(np.float32)
    monkeypatch.setattr(metrics, "faiss_available", lambda: False)
    monkeypatch.setattr(metrics, "SKLEARN_SLOW_FROM", 8)
    with caplog.at_level("WARNING", logger="deepmetric.evaluation.metrics"):
        assert len(set(metrics.kmeans_labels(x, 7).tolist())) <= 7 and not caplog.records
        assert len(metrics.kmeans_labels(x, 8)) == 40
    assert [r.getMessage() for r in caplog.records] == [
        "NMI: k-means with 8 clusters by scikit-learn, because faiss is not installed; this is slow "
        "(pip install faiss-cpu, or eval.nmi=false)"]


@pytest.mark.parametrize(("call", "message"), [
    (lambda: retrieval_metrics(np.ones(4), [0, 0, 1, 1]),
     r"^query embeddings must be a 2-D array \(n, D\), got shape \(4,\)$"),
    (lambda: retrieval_metrics(np.eye(2), [0, 0], np.zeros((0, 2)), []), r"^gallery embeddings are empty \(0 rows\)$"),
    (lambda: retrieval_metrics(np.eye(2), ["a", "a"]),
     r"^query labels must be integer class labels, got an array of <U1 \(map names to integers first\)$"),
    (lambda: retrieval_metrics(np.eye(2), [0.0, 0.5]), r"^query labels must be integer class labels$"),
    (lambda: retrieval_metrics(np.eye(2), [0, 0], np.eye(2), [0, 0, 1]), r"^gallery labels: 3 entries for 2"),
    (lambda: retrieval_metrics(np.eye(2), [0, 0], gallery_labels=[0, 0]),
     r"^gallery labels given without gallery embeddings$"),
    (lambda: retrieval_metrics(np.eye(2), [0, 0], np.eye(2)), r"^gallery embeddings given without gallery labels$"),
    (lambda: retrieval_metrics(np.eye(2), [0, 0], np.eye(3), [0, 0, 1]),
     r"^query embeddings have 2 dimensions, gallery embeddings 3$"),
    (lambda: retrieval_metrics(np.eye(3), [0, 1, 2]),
     r"^no query has another item of its class in the gallery; nothing to retrieve$"),
])
def test_each_bad_input_gets_its_own_message_naming_the_argument(call, message):
    with pytest.raises(DeepMetricError, match=message):
        call()


def test_labels_may_be_integral_floats_or_tensors_and_one_query_is_enough():
    x, y = angles(0, 10, 50, 20, 30), [0, 0, 0, 1, 1]
    expected = retrieval_metrics(x, y, recall_at=(1, 2), nmi=False)
    for labels in (np.array(y, dtype=np.float64), torch.tensor(y, dtype=torch.float32), torch.tensor(y)):
        assert retrieval_metrics(torch.tensor(x), labels, recall_at=(1, 2), nmi=False) == expected
    one = retrieval_metrics(angles(0), [1], angles(5, 60), [1, 0], recall_at=(1,), nmi=False)  # a 1-row query
    assert one == {"recall@1": 1.0, "map@r": 1.0, "r_precision": 1.0}


def test_recall_at_k_beyond_the_gallery_counts_every_rank(caplog):
    """K larger than the gallery: every item is searched, the last one included (own row excluded when there is
    no gallery), and a warning says that such a K counts every query with a match; a query whose class is absent
    from the gallery (even a label above all of the gallery's) is left out, with a warning that counts it."""
    # q (0 deg, class 0) meets its only positive last, at rank 3 of 3
    with caplog.at_level("WARNING", logger="deepmetric.evaluation.metrics"):
        m = retrieval_metrics(angles(0), [0], angles(10, 20, 170), [1, 1, 0], recall_at=(1, 2, 3, 50), nmi=False)
    assert [m[f"recall@{k}"] for k in (1, 2, 3, 50)] == [0.0, 0.0, 1.0, 1.0]
    assert [r.getMessage() for r in caplog.records] == [
        "Recall@3,50: K reaches the 3 items each query is ranked against, so every query with a match counts as a "
        "hit (1.0)"]
    caplog.clear()
    m = retrieval_metrics(angles(0, 10, 20, 170), [0, 1, 1, 0], recall_at=(3, 50), nmi=False)  # own row removed
    assert m["recall@3"] == 1.0 and m["recall@50"] == 1.0
    caplog.clear()
    with caplog.at_level("WARNING", logger="deepmetric.evaluation.metrics"):
        m = retrieval_metrics(angles(0, 90, 20), [0, 7, 1], angles(10, 100, 190), [0, 1, 1], recall_at=(1,), nmi=False)
    # q0 finds its class first; q2 (20 deg, class 1) meets 10 (class 0), then 100 (1): AP (1/2)(0 + 1/2)
    assert m["recall@1"] == 0.5 and m["map@r"] == pytest.approx((1 + 0.25) / 2)
    assert [r.getMessage() for r in caplog.records] == [
        "1 of 3 queries have no other item of their class in the gallery and are left out"]


def test_all_zero_embeddings_and_duplicate_points_are_named_in_a_warning(caplog):
    """A collapsed model's all-zero embeddings scored silently (ties decided the ranks), and NMI's k-means on
    duplicate points printed scikit-learn's ConvergenceWarning with its source line: each is now one warning."""
    x = np.zeros((6, 4), np.float32)
    x[0, 0] = 1.0
    with caplog.at_level("WARNING", logger="deepmetric.evaluation.metrics"):
        retrieval_metrics(x, [0, 0, 1, 1, 2, 2], recall_at=(1,))
    assert [r.getMessage() for r in caplog.records] == [
        "5 of 6 query embeddings are all zeros: their cosine similarity is 0 with every item, so where their matches "
        "rank is decided by ties",
        "NMI: k-means found 2 distinct clusters of the 3 asked for: the embeddings hold duplicate points (a collapsed "
        "model?)"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="deepmetric.evaluation.metrics"):
        retrieval_metrics(angles(0, 5), [0, 1], np.zeros((2, 2), np.float32), [0, 1], recall_at=(1,), nmi=False)
    assert [r.getMessage() for r in caplog.records] == [
        "2 of 2 gallery embeddings are all zeros: their cosine similarity is 0 with every item, so where their "
        "matches rank is decided by ties"]


def test_nmi_is_null_with_a_warning_where_undefined_and_deterministic_where_defined(caplog):
    """NMI needs 2 or more query classes and fewer classes than queries: else None and one warning naming the
    counts; where it is defined it is a number, no warning, and the same at every call (k-means from seed 0)."""
    gallery, gallery_labels = angles(0, 5, 90, 95), [0, 0, 1, 1]
    with caplog.at_level("WARNING", logger="deepmetric.evaluation.metrics"):
        every_query_its_class = retrieval_metrics(angles(1, 91), [0, 1], gallery, gallery_labels, recall_at=(1, 2))
        one_class = retrieval_metrics(angles(1, 3), [0, 0], gallery, gallery_labels, recall_at=(1, 2))
    assert every_query_its_class["nmi"] is None and one_class["nmi"] is None
    assert [r.getMessage() for r in caplog.records] == [
        "NMI is undefined here (the 2 queries hold 2 classes; it needs 2 or more, and fewer classes than queries): "
        "reported as null",
        "NMI is undefined here (the 2 queries hold 1 classes; it needs 2 or more, and fewer classes than queries): "
        "reported as null"]
    caplog.clear()
    x = np.random.default_rng(3).normal(size=(40, 6))  # no cluster structure: k-means depends on its start
    y = np.arange(40) % 8
    with caplog.at_level("WARNING", logger="deepmetric.evaluation.metrics"):
        scores = {retrieval_metrics(x, y, recall_at=(1,))["nmi"] for _ in range(3)}
    assert len(scores) == 1 and 0.0 < scores.pop() < 1.0 and not caplog.records


def test_nmi_k_means_is_faiss_from_a_hundred_clusters_and_prints_nothing(monkeypatch, capfd):
    """NMI's k-means is faiss' from FAISS_KMEANS_FROM = 100 clusters (issue 39, item 23: scikit-learn's k-means++
    took 41 of 44 s at 816 clusters), scikit-learn's below (lowered here to 4): on 4 separated clusters faiss
    recovers them (NMI 1), one label per row; with 5 points per cluster (below faiss' 39) faiss writes no warning
    of its own to stderr."""
    from deepmetric.evaluation import metrics

    pytest.importorskip("faiss")
    import faiss

    assert metrics.FAISS_KMEANS_FROM == 100
    monkeypatch.setattr(metrics, "FAISS_KMEANS_FROM", 4)
    made = []
    monkeypatch.setattr(faiss, "Kmeans", lambda *a, k=faiss.Kmeans, **kw: made.append(a) or k(*a, **kw))
    x = (np.repeat(np.eye(6)[:4] * 5, 10, axis=0) + 0.01 * np.random.default_rng(0).normal(size=(40, 6)))
    assignments = metrics.kmeans_labels(x.astype(np.float32), 4)
    assert assignments.shape == (40,) and len(set(assignments.tolist())) == 4
    assert metrics.nmi_score(x, np.repeat(np.arange(4), 10)) == pytest.approx(1.0)
    metrics.kmeans_labels(x.astype(np.float32), 3)  # scikit-learn's
    metrics.kmeans_labels(x.astype(np.float32), 8)
    assert made == [(6, 4), (6, 4), (6, 8)]
    assert capfd.readouterr() == ("", "")


def test_nmi_equals_pytorch_metric_learnings_with_the_same_k_means_seed():
    """Oracle: PML's NMI runs faiss' k-means with 20 iterations; given the same seed, ours is the same number."""
    pytest.importorskip("faiss")
    pml = pytest.importorskip("pytorch_metric_learning.utils.accuracy_calculator")
    from pytorch_metric_learning.utils.inference import FaissKMeans

    rng = np.random.default_rng(3)
    centres = rng.normal(size=(120, 16))  # from FAISS_KMEANS_FROM clusters on
    labels = np.repeat(np.arange(120), 3)
    x = (centres[labels] + 0.9 * rng.normal(size=(360, 16))).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)  # ours clusters the l2-normalised embeddings, PML what it is given
    calculator = pml.AccuracyCalculator(include=("NMI",), kmeans_func=FaissKMeans(niter=20, seed=0))
    theirs = calculator.get_accuracy(torch.tensor(x), torch.tensor(labels))["NMI"]
    ours = retrieval_metrics(x, labels, recall_at=(1,))["nmi"]
    assert 0.3 < ours < 0.99 and ours == pytest.approx(theirs, abs=1e-12)


def test_a_large_ranking_shows_a_bar_and_a_large_k_means_a_line_only_with_progress(monkeypatch, capsys, caplog):
    """Issue 39, item 23: evaluate sat minutes with no output. From SHOWN_FROM query x gallery pairs (lowered
    here) the ranking shows a progress bar on stderr and NMI's k-means is announced; nothing with progress off
    and nothing on stdout."""
    from deepmetric.evaluation import metrics

    x = np.random.default_rng(0).normal(size=(60, 8)).astype(np.float32)
    y = np.repeat(np.arange(12), 5)
    monkeypatch.setattr(metrics, "SHOWN_FROM", 1000)
    with caplog.at_level("INFO", logger="deepmetric.evaluation.metrics"):
        quiet = retrieval_metrics(x, y, recall_at=(1,))
        shown = capsys.readouterr()
        assert shown == ("", "") and not caplog.records
        loud = retrieval_metrics(x, y, recall_at=(1,), progress=True)
    out, err = capsys.readouterr()
    assert loud == quiet and out == "" and "ranking" in err and "60/60" in err
    assert [r.getMessage() for r in caplog.records] == [
        "NMI: k-means of 60 embeddings into 12 clusters (scikit-learn)"]
    monkeypatch.setattr(metrics, "SHOWN_FROM", 10**9)
    retrieval_metrics(x, y, recall_at=(1,), progress=True)
    assert capsys.readouterr().err == ""


def test_faiss_cpu_is_a_core_dependency():
    """The fast NMI is the default install's: faiss-cpu is in the project's dependencies, not only an extra."""
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    assert any(d.replace(" ", "").startswith("faiss-cpu") for d in project["dependencies"])


@pytest.mark.parametrize(("n_gallery", "memory_mb"), [(1, 256.0), (1000, 1.0), (12345, 64.0), (10**7, 0.5)])
def test_a_block_of_queries_holds_three_float32_matrices_within_the_memory_budget(n_gallery, memory_mb):
    """``block_rows_for``: the most query rows b with 3 (b, n_gallery) float32 matrices (similarities, and the
    selection's work) within ``memory_mb``, at least 1."""
    from deepmetric.evaluation.knn import block_rows_for

    b = block_rows_for(n_gallery, memory_mb)
    budget = memory_mb * 2**20
    assert b >= 1 and (b == 1 or 3 * 4 * n_gallery * b <= budget) and 3 * 4 * n_gallery * (b + 1) > budget


def test_faiss_is_available_exactly_when_it_imports(monkeypatch):
    import sys

    from deepmetric.evaluation.knn import faiss_available

    monkeypatch.setitem(sys.modules, "faiss", None)  # `import faiss` now raises ImportError
    assert faiss_available() is False


def test_iter_knn_walks_the_queries_in_blocks_sized_for_the_gallery_and_budget(monkeypatch):
    """The kNN on one thread holds one block of queries at a time: ``block_rows_for(gallery rows, memory_mb)`` rows
    (the gallery's row count, not its width, sets the block; on w threads, w blocks of ``memory_mb / w``)."""
    from deepmetric.evaluation import knn as knn_module
    from deepmetric.evaluation.knn import block_rows_for, iter_knn

    monkeypatch.setattr(knn_module, "knn_workers", lambda: 1)
    x = torch.nn.functional.normalize(torch.randn(300, 4, generator=torch.Generator().manual_seed(0)), dim=1)
    memory_mb = 0.1
    block = block_rows_for(300, memory_mb)
    assert 1 < block < 300
    starts = [start for start, _, _ in iter_knn(x, x, 3, memory_mb=memory_mb)]
    assert starts == list(range(0, 300, block))


@pytest.mark.parametrize("self_index", [False, True])
def test_the_faiss_engine_searches_with_faiss_and_returns_the_torch_engines_neighbours(monkeypatch, self_index):
    """``engine="faiss"`` takes its candidates from a faiss index (not a silent fall-back to torch, which would
    give the same answer), then re-scores them exactly: the neighbours equal the torch engine's."""
    pytest.importorskip("faiss")
    from deepmetric.evaluation import knn as knn_module

    calls = []
    block = knn_module._FaissSearcher.block
    monkeypatch.setattr(knn_module._FaissSearcher, "block", lambda self, *a: calls.append(1) or block(self, *a))
    x = torch.nn.functional.normalize(torch.randn(30, 8, generator=torch.Generator().manual_seed(0)), dim=1)
    own = torch.arange(30) if self_index else None
    torch_values, torch_indices = knn(x, x, 5, own, memory_mb=0.001, engine="torch")
    faiss_values, faiss_indices = knn(x, x, 5, own, memory_mb=0.001, engine="faiss")
    assert calls and torch.equal(faiss_indices, torch_indices)
    assert torch.allclose(faiss_values, torch_values, atol=1e-6)
    assert not (torch_indices == torch.arange(30)[:, None]).any() or not self_index
