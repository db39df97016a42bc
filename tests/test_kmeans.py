"""faiss' k-means written in torch (``evaluation/kmeans.py``, NMI's k-means on a GPU) against faiss itself: its
random permutation, its generator, its splits of empty clusters, its labels, and the NMI routed to it by the
``cuda`` engine. The GPU cases are skipped where torch sees no CUDA device."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from deepmetric.evaluation import kmeans, metrics

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                  reason="needs a CUDA device"))]


def faiss_kmeans(x: np.ndarray, k: int, niter: int = 20, seed: int = 0):
    faiss = pytest.importorskip("faiss")
    found = faiss.Kmeans(x.shape[1], k, niter=niter, seed=seed, min_points_per_centroid=1)
    found.train(x)
    return found


def clustered(n: int, classes: int, dim: int, noise: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = np.concatenate([np.arange(classes), rng.integers(0, classes, n - classes)])
    x = rng.normal(size=(classes, dim))[labels] + noise * rng.normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32), labels


def test_the_generator_is_std_mt19937():
    """The C++ standard requires the 10,000th output of a default-constructed std::mt19937 (seed 5489) to be
    4123659995 ([rand.predef]): an oracle that needs no faiss."""
    assert kmeans.MersenneTwister(5489).peek(10_000)[-1] == 4123659995


@pytest.mark.parametrize(("n", "seed", "count"), [(1, 0, 1), (2, 0, 2), (10, 1, 10), (1000, 1, 37),
                                                  (5000, 1234, 5000), (60502, 1, 11316)])
def test_the_copy_of_rand_perm_is_faiss_own(n, seed, count):
    faiss = pytest.importorskip("faiss")
    theirs = np.empty(n, dtype=np.int32)
    faiss.rand_perm(faiss.swig_ptr(theirs), n, seed)
    assert np.array_equal(kmeans.rand_perm_copy(n, seed, count), theirs[:count])
    assert np.array_equal(kmeans.rand_perm(n, seed, count), theirs[:count])


def test_without_faiss_the_permutation_is_the_copy(monkeypatch):
    faiss = pytest.importorskip("faiss")
    theirs = np.empty(1000, dtype=np.int32)
    faiss.rand_perm(faiss.swig_ptr(theirs), 1000, 7)
    monkeypatch.setattr(kmeans, "faiss_available", lambda: False)
    monkeypatch.setattr(faiss, "rand_perm", lambda *a: pytest.fail("faiss asked though it is 'not installed'"))
    assert np.array_equal(kmeans.rand_perm(1000, 7), theirs) and np.array_equal(kmeans.rand_perm(1000, 7, 30),
                                                                                  theirs[:30])


def test_empty_clusters_are_split_as_faiss_splits_them():
    """40 distinct points repeated to 300 (no noise): the start holds the same point several times, the copies after
    the first get no point (the lowest index wins a tie), and faiss re-seeds each from a donor drawn at random. After
    one iteration the centroids are faiss', donors and perturbations included (a wrong donor moves a centroid by the
    distance between two points, not by a rounding error)."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(40, 8)).astype(np.float32)[rng.integers(0, 40, size=300)]
    theirs = faiss_kmeans(x, 30, niter=1)
    assert theirs.iteration_stats[0]["nsplit"] >= 5
    ours = kmeans.faiss_rule_centroids(torch.from_numpy(x), 30, niter=1).numpy()
    np.testing.assert_allclose(ours, theirs.centroids, rtol=0, atol=1e-6)
    centroids, sizes = kmeans.centroid_means(torch.from_numpy(x), torch.arange(300) % 25, 30)
    assert kmeans.split_empty_clusters(centroids, sizes, 300) == 5 and (sizes > 0).all()
    assert kmeans.split_empty_clusters(centroids, sizes, 300) == 0


def split_pairs_one_draw_at_a_time(sizes: np.ndarray, n: int) -> list[tuple[int, int]]:
    """faiss' split_clusters as its C++ loop reads, one draw at a time: the slow reference of ``split_pairs``."""
    k, pairs = len(sizes), []
    rng = kmeans.MersenneTwister(kmeans.SPLIT_SEED)
    for empty in range(k):
        if sizes[empty] != 0:
            continue
        donor, tries = 0, 0
        while tries < 10 * k:
            chance = np.float32((np.float64(sizes[donor]) - 1.0) / np.float64(np.float32(n - k)))
            draw = rng.floats(1)[0]
            rng.consume(1)
            if draw < chance:
                break
            tries, donor = tries + 1, (donor + 1) % k
        else:
            donor = int(np.argmax(sizes))
        sizes[empty] = sizes[donor] / np.float32(2)
        sizes[donor] -= sizes[empty]
        pairs.append((empty, donor))
    return pairs


@pytest.mark.parametrize("seed", range(5))
def test_the_donors_drawn_in_chunks_are_the_donors_drawn_one_at_a_time(seed):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 6, size=200).astype(np.float32)  # about one cluster in six empty
    n = int(sizes.sum())
    expected_sizes = sizes.copy()
    expected = split_pairs_one_draw_at_a_time(expected_sizes, n)
    assert kmeans.split_pairs(sizes, n) == expected and len(expected) > 20
    assert np.array_equal(sizes, expected_sizes)


def test_a_donor_never_drawn_is_the_largest_cluster_after_ten_tries_per_cluster(monkeypatch):
    """faiss' fallback: draws that never fall under a chance (here every draw is 1.0, every chance below 1) split
    the largest cluster, the first of equals, after 10 k tries."""
    taken = []
    monkeypatch.setattr(kmeans.MersenneTwister, "floats", lambda self, count: np.ones(count, dtype=np.float32))
    monkeypatch.setattr(kmeans.MersenneTwister, "consume", lambda self, count: taken.append(count))
    sizes = np.array([0, 1, 1, 3, 1, 3], dtype=np.float32)
    assert kmeans.split_pairs(sizes, 9) == [(0, 3)]
    assert sizes.tolist() == [1.5, 1, 1, 1.5, 1, 3] and sum(taken) == 60


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("n", "classes", "dim", "noise", "seed"), [
    (600, 120, 16, 0.5, 0), (600, 120, 16, 1.0, 1), (1000, 300, 32, 0.8, 2), (2000, 5, 8, 0.3, 3),
    (2048, 8, 8, 0.3, 4), (300, 1, 8, 0.3, 5)])
def test_the_labels_are_faiss_labels(device, n, classes, dim, noise, seed):
    """Clustered sets (the fourth more than 256 points per cluster: faiss trains on a subsample; the fifth exactly
    256, where it does not; the last one cluster): the same start, steps and splits give faiss' labels, point for
    point."""
    x, _ = clustered(n, classes, dim, noise, seed)
    theirs = faiss_kmeans(x, classes)
    ours = kmeans.kmeans_faiss_rule(torch.from_numpy(x).to(device), classes).cpu().numpy()
    assert np.array_equal(ours, theirs.index.search(x, 1)[1][:, 0])


def test_the_means_added_a_few_points_at_a_time_are_the_means_added_at_once():
    x, labels = clustered(500, 40, 16, 0.5, 6)
    points, assigned = torch.from_numpy(x), torch.from_numpy(labels)
    at_once, sizes = kmeans.centroid_means(points, assigned, 45)
    in_pieces, same_sizes = kmeans.centroid_means(points, assigned, 45, memory_mb=16 * 8 * 7 / 2**20)  # 7 rows
    assert torch.equal(at_once, in_pieces) and np.array_equal(sizes, same_sizes) and (sizes[40:] == 0).all()
    assert (at_once[40:] == 0).all()
    np.testing.assert_allclose(at_once[3].numpy(), x[labels == 3].mean(axis=0), rtol=0, atol=1e-6)


@pytest.mark.parametrize("rows", [64, 1])
def test_the_distances_and_the_sums_stay_within_the_memory_budget(monkeypatch, rows):
    """``memory_mb`` bounds the distances (``rows`` points x k centroids of float32) and the float64 points added at
    a time, down to one row; the blocks change no label and no mean; the k-means passes its budget on to both."""
    x = torch.from_numpy(clustered(1000, 50, 16, 0.5, 7)[0])
    distance_rows, summed_rows = [], []
    addmm, index_add = torch.addmm, torch.Tensor.index_add_
    monkeypatch.setattr(torch, "addmm", lambda bias, block, *a, **kw: distance_rows.append(len(block))
                        or addmm(bias, block, *a, **kw))
    monkeypatch.setattr(torch.Tensor, "index_add_", lambda self, dim, index, source: summed_rows.append(len(source))
                        or index_add(self, dim, index, source))
    distances_budget, sums_budget = 4 * 50 * rows / 2**20, 8 * 16 * rows / 2**20
    labels = kmeans.nearest_centroids(x, x[:50], memory_mb=distances_budget)
    assert distance_rows == [rows] * (1000 // rows) + ([1000 % rows] if 1000 % rows else [])
    means, _ = kmeans.centroid_means(x, labels, 50, memory_mb=sums_budget)
    assert summed_rows == distance_rows
    at_once = kmeans.centroid_means(x, labels, 50)[0]
    assert torch.equal(labels, kmeans.nearest_centroids(x, x[:50])) and torch.equal(means, at_once)
    distance_rows.clear()
    summed_rows.clear()
    kmeans.kmeans_faiss_rule(x, 50, niter=3, memory_mb=distances_budget)
    assert max(distance_rows) == rows and max(summed_rows) == max(1, 4 * 50 * rows // (8 * 16))  # the same budget


def test_as_many_points_as_clusters_makes_each_point_its_cluster():
    x, _ = clustered(20, 20, 4, 0.1, 0)
    assert kmeans.kmeans_faiss_rule(torch.from_numpy(x), 20).tolist() == list(range(20))
    for k in (21, 0):
        with pytest.raises(ValueError, match=f"1 to 20 clusters for 20 points, got {k}"):
            kmeans.kmeans_faiss_rule(torch.from_numpy(x), k)


@pytest.mark.parametrize("device", DEVICES)
def test_kmeans_labels_on_a_device_is_faiss_and_below_a_hundred_clusters_still_scikit_learn(device, monkeypatch):
    pytest.importorskip("faiss")
    x, _ = clustered(800, 150, 16, 0.6, 4)
    assert np.array_equal(metrics.kmeans_labels(x, 150, device=torch.device(device)), metrics.kmeans_labels(x, 150))
    monkeypatch.setattr(metrics, "kmeans_faiss_rule", lambda *a, **kw: pytest.fail("not below FAISS_KMEANS_FROM"))
    assert len(metrics.kmeans_labels(x, 20, device=torch.device(device))) == 800


def test_nmi_takes_the_gpu_with_the_cuda_engine_and_the_cpu_otherwise(monkeypatch):
    seen = []
    monkeypatch.setattr(metrics, "kmeans_labels", lambda x, k, seed, device: seen.append(device) or np.arange(len(x)))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    labels = np.repeat(np.arange(150), 2)
    for engine in ("torch", "numpy", "cuda", "auto"):
        metrics.nmi_score(np.eye(300, 4), labels, engine=engine)
    assert seen == [None, None, torch.device("cuda", 0), torch.device("cuda", 0)]
    assert metrics.kmeans_name(150, "cuda") == "faiss' rule, in torch on the GPU"
    assert metrics.kmeans_name(99, "cuda") == "scikit-learn"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_retrieval_metrics_with_the_cuda_engine_report_faiss_nmi():
    from deepmetric.evaluation import retrieval_metrics

    pytest.importorskip("faiss")
    x, y = clustered(1500, 300, 32, 0.9, 5)
    on_gpu = retrieval_metrics(x, y, recall_at=(1,), engine="cuda")
    on_cpu = retrieval_metrics(x, y, recall_at=(1,), engine="torch")
    assert on_gpu["nmi"] == on_cpu["nmi"] and on_gpu == on_cpu
