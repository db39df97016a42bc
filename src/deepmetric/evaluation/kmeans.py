"""faiss' k-means, as NMI runs it (pytorch-metric-learning's call), written in torch so that it can run on a GPU.

faiss' ``Kmeans(d, k, niter=20, seed=s)`` (faiss/Clustering.cpp and impl/ClusteringHelpers.cpp, 1.15):

1. when there are more than 256 points per cluster, train on the first ``256 k`` points of ``rand_perm(n, s)``;
2. start from the points ``rand_perm(n, s + 1)[:k]``;
3. each iteration: assign every point to its nearest centroid (squared L2 distance; the lowest index among equal
   distances); each centroid becomes the mean of its points; an empty cluster is re-seeded by splitting a donor
   drawn with probability ``(size - 1) / (n - k)`` from a generator seeded 1234 at every iteration (the donors are
   tried in order 0, 1, ... until a draw falls under that probability; the largest cluster after ``10 k`` failed
   tries): both take the donor's centroid scaled by ``1 ± 1/1024`` alternately along the dimensions, and share its
   count;
4. the labels are the nearest final centroids of all n points (``kmeans.index.search(x, 1)``).

``rand_perm`` is faiss' own where faiss is installed, else a copy of faiss 1.15's (a Fisher-Yates shuffle by
``std::mt19937(seed)`` with ``mt() % m``; faiss' development branch has since changed it to ``(mt() * m) >> 32``, so
two faiss versions may start from different points). The donors' generator is ``std::mt19937`` (numpy's MT19937,
seeded as the C++ one is).

Two departures, neither of which changes the result in exact arithmetic: a centroid's sum is accumulated in float64
and rounded to float32 (faiss sums float32 in point order; the GPU's atomic float32 sums would also differ between
runs), and the distance compared is ``|c|^2 - 2 x.c`` (faiss adds ``|x|^2``, the same for every centroid of a point).
So the clustering is faiss' wherever no point lies within a rounding error of two centroids; on an SOP-sized set the
NMI of the two differs in about the fifth decimal (docs/benchmarks/evaluation.md). The iterations stop early once an
assignment repeats, after which every iteration would repeat it (faiss stops when the objective repeats).
"""

from __future__ import annotations

import numpy as np
import torch

from .knn import faiss_available, full_float32_products

SPLIT_SEED = 1234
"""faiss re-seeds the generator that picks the donor of an empty cluster with this at every iteration."""

SPLIT_EPS = np.float32(1 / 1024)
"""A split moves the two centroids apart by this relative amount (faiss: "a bit above machine epsilon for float16")."""


class MersenneTwister:
    """``std::mt19937(seed)``'s 32-bit outputs in order (faiss' ``RandomGenerator``), drawn in chunks."""

    def __init__(self, seed: int):
        self._bits = np.random.MT19937()
        self._bits._legacy_seeding(int(seed) & 0xFFFFFFFF)  # init_genrand(seed): std::mt19937's seeding
        self._buffer = np.empty(0, dtype=np.uint64)

    def peek(self, count: int) -> np.ndarray:
        """The next ``count`` outputs (as uint64), not consumed."""
        if len(self._buffer) < count:
            self._buffer = np.concatenate([self._buffer, self._bits.random_raw(count - len(self._buffer))])
        return self._buffer[:count]

    def consume(self, count: int) -> None:
        self.peek(count)
        self._buffer = self._buffer[count:]

    def floats(self, count: int) -> np.ndarray:
        """The next ``count`` of ``rand_float()``: ``mt() / float(mt.max())`` in float32, not consumed."""
        return self.peek(count).astype(np.uint32).astype(np.float32) / np.float32(4294967295.0)


def rand_perm(n: int, seed: int, count: int | None = None) -> np.ndarray:
    """The first ``count`` (default all) entries of faiss' ``rand_perm(n, seed)``, int64: faiss' own where it is
    installed, else the copy of faiss 1.15's shuffle."""
    count = n if count is None else count
    if faiss_available():
        import faiss

        perm = np.empty(n, dtype=np.int32)
        faiss.rand_perm(faiss.swig_ptr(perm), n, int(seed))  # type: ignore[attr-defined]  # SWIG, no stub
        return perm[:count].astype(np.int64)
    return rand_perm_copy(n, seed, count)


def rand_perm_copy(n: int, seed: int, count: int) -> np.ndarray:
    """faiss 1.15's ``rand_perm``: for i = 0 .. n - 2, swap entry i with entry ``i + mt() % (n - i)``. Entry i is
    final after step i, so the first ``count`` entries need only ``count`` steps."""
    steps = min(count, n - 1)
    draws = MersenneTwister(seed).peek(max(steps, 0))
    spans = np.arange(n, n - steps, -1, dtype=np.int64).astype(np.uint64)
    partners = (np.arange(steps) + (draws % spans).astype(np.int64)).tolist()
    perm = list(range(n))
    for i, j in enumerate(partners):
        perm[i], perm[j] = perm[j], perm[i]
    return np.asarray(perm[:count], dtype=np.int64)


def rows_within(memory_mb: float, row_bytes: int) -> int:
    """Rows of ``row_bytes`` each that fit in ``memory_mb`` (one at the least)."""
    return max(1, int(memory_mb * 2**20 / row_bytes))


def nearest_centroids(points: torch.Tensor, centroids: torch.Tensor, memory_mb: float = 256.0) -> torch.Tensor:
    """Each point's nearest centroid by squared L2 distance (the lowest index among equals), in blocks of points
    whose distances stay near ``memory_mb``; full float32 products (no TF32)."""
    norms = (centroids * centroids).sum(dim=1)
    rows = rows_within(memory_mb, 4 * len(centroids))
    labels = torch.empty(len(points), dtype=torch.long, device=points.device)
    with full_float32_products():
        for start in range(0, len(points), rows):
            block = points[start:start + rows]
            labels[start:start + rows] = torch.addmm(norms, block, centroids.t(), alpha=-2).argmin(dim=1)
    return labels


def centroid_means(points: torch.Tensor, labels: torch.Tensor, k: int,
                   memory_mb: float = 256.0) -> tuple[torch.Tensor, np.ndarray]:
    """Each cluster's mean (zero for an empty cluster, as faiss leaves it) and the clusters' sizes (float32 on the
    host: faiss' ``hassign``). The sums are float64 (added ``memory_mb`` of points at a time), rounded to float32 and
    then scaled by ``1 / size``."""
    sums = torch.zeros(k, points.shape[1], dtype=torch.float64, device=points.device)
    rows = rows_within(memory_mb, 8 * points.shape[1])
    for start in range(0, len(points), rows):
        sums.index_add_(0, labels[start:start + rows], points[start:start + rows].double())
    sizes = torch.bincount(labels, minlength=k).float()
    means = sums.float() * torch.where(sizes > 0, 1 / sizes, torch.zeros_like(sizes))[:, None]
    return means, sizes.cpu().numpy()


def split_pairs(sizes: np.ndarray, n: int) -> list[tuple[int, int]]:
    """faiss' ``split_clusters`` on the sizes alone: the (empty cluster, donor) pairs in the order faiss splits them;
    ``sizes`` is updated as faiss updates ``hassign``."""
    k = len(sizes)
    rng = MersenneTwister(SPLIT_SEED)
    denominator = float(np.float32(n - k))
    max_tries = 10 * k
    pairs = []
    for empty in np.flatnonzero(sizes == 0).tolist():  # a split never empties a cluster: this set is fixed
        donor, tried = -1, 0
        while donor < 0 and tried < max_tries:
            chunk = min(k, max_tries - tried)
            candidates = (tried + np.arange(chunk)) % k
            chances = ((sizes[candidates].astype(np.float64) - 1.0) / denominator).astype(np.float32)
            hits = np.flatnonzero(rng.floats(chunk) < chances)
            used = hits[0] + 1 if len(hits) else chunk
            rng.consume(int(used))
            if len(hits):
                donor = int(candidates[hits[0]])
            tried += int(used)
        if donor < 0:
            donor = int(np.argmax(sizes))  # faiss' fallback: the largest cluster (the first of equals)
        sizes[empty] = sizes[donor] / np.float32(2)
        sizes[donor] -= sizes[empty]
        pairs.append((empty, donor))
    return pairs


def split_empty_clusters(centroids: torch.Tensor, sizes: np.ndarray, n: int) -> int:
    """Re-seed every empty cluster as faiss does (in place); returns the number of splits."""
    pairs = split_pairs(sizes, n)
    if not pairs:
        return 0
    rows = sorted({row for pair in pairs for row in pair})
    local = {row: i for i, row in enumerate(rows)}
    host = centroids[rows].cpu().numpy()
    up = np.where(np.arange(centroids.shape[1]) % 2 == 0, 1 + SPLIT_EPS, 1 - SPLIT_EPS).astype(np.float32)
    down = (2 - up).astype(np.float32)  # 1 - EPS where up is 1 + EPS, and the reverse; both exact in float32
    for empty, donor in pairs:
        host[local[empty]] = host[local[donor]] * up
        host[local[donor]] = host[local[donor]] * down
    centroids[rows] = torch.from_numpy(host).to(centroids.device)
    return len(pairs)


def kmeans_faiss_rule(points: torch.Tensor, k: int, niter: int = 20, seed: int = 0,
                      max_points_per_centroid: int = 256, memory_mb: float = 256.0) -> torch.Tensor:
    """Labels (n,) of faiss' ``Kmeans(d, k, niter, seed)`` run on ``points`` (float32 (n, d), on any device, where
    it runs), as in the module's docstring; on ``points``' device."""
    centroids = faiss_rule_centroids(points, k, niter, seed, max_points_per_centroid, memory_mb)
    return nearest_centroids(points, centroids, memory_mb)


def faiss_rule_centroids(points: torch.Tensor, k: int, niter: int = 20, seed: int = 0,
                         max_points_per_centroid: int = 256, memory_mb: float = 256.0) -> torch.Tensor:
    """The (k, d) centroids of faiss' ``Kmeans(d, k, niter, seed).train(points)`` (its ``centroids``)."""
    n = points.shape[0]
    if not 0 < k <= n:
        raise ValueError(f"k-means needs 1 to {n} clusters for {n} points, got {k}")
    train = points
    if n > k * max_points_per_centroid:
        train = points[torch.from_numpy(rand_perm(n, seed, k * max_points_per_centroid)).to(points.device)]
    if len(train) == k:  # faiss' corner case: the points are the centroids
        return train.clone()
    centroids = train[torch.from_numpy(rand_perm(len(train), seed + 1, k)).to(points.device)].clone()
    previous = None
    for _ in range(niter):
        labels = nearest_centroids(train, centroids, memory_mb)
        if previous is not None and torch.equal(labels, previous):
            break  # a fixed point: every later iteration repeats this one
        previous = labels
        centroids, sizes = centroid_means(train, labels, k, memory_mb)
        split_empty_clusters(centroids, sizes, len(train))
    return centroids
