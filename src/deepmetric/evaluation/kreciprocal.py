"""k-reciprocal re-ranking (Zhong, Zheng, Cao and Li, CVPR 2017, "Re-ranking Person Re-identification with
k-reciprocal Encoding"), exact, without the N x N distance matrix.

Distance: the embeddings are l2-normalised, so the squared Euclidean distance the paper uses is
``d(p, g) = 2 - 2 s(p, g)`` with s the library's float32 cosine similarity, in float64 (where it is exact), and an
item's distance to itself 0 (a copy's may come out a rounding error below 0, which changes nothing). Rankings are
the exact kNN's (``knn.py``): by decreasing similarity, ties by increasing index.

Where the paper and the authors' public code differ, this follows the code, whose output the paper's tables
report:

- the neighbourhoods live in the set of every query and gallery item together (queries first; in single-set
  retrieval the set itself), and an item's N(i, k) is itself followed by its k nearest others (k + 1 items);
- each row of distances is divided by its largest value before anything else (``d~ = d / max_g d(p, g)``),
  which both the weights of Eq. 7 and the λ term of Eq. 12 use;
- Eq. 6 adds R(q, round(k1/2)) when ``|R(p, k1) ∩ R(q, round(k1/2))| > 2/3 |R(q, round(k1/2))|`` (strictly
  more; the paper writes >=), tested in integers (3·count > 2·size); ``round`` halves to even, as numpy's;
- V's weights (Eq. 7) are normalised to sum 1 per row, so that Eq. 11's denominator is 2 - Σ min;
- the local query expansion (Eq. 10) averages the V of N(p, k2): p and its k2 - 1 nearest others.

The steps, each a function below:

- ``neighbour_graph``: N(i, k) for every item (Eq. 3) and each row's smallest similarity (for ``d~``), from one
  blocked pass of products (memory ``block x items``, as the kNN's);
- ``reciprocal_mask``: R(i, k) = {j in N(i, k) : i in N(j, k)} (Eq. 4);
- ``expanded_sets``: R*(i, k1) = R(i, k1) ∪ R(q, k1/2) for the q that pass the 2/3 rule (Eq. 6);
- ``encode``: V_{i,j} = exp(-d~(i, j)) / Σ over R*(i) for j in R*(i), else 0 (Eq. 7), the similarities
  from the products of the first pass where j was listed, else a dot product (``member_sims``);
- ``local_expansion``: V_i <- mean of V_j over N(i, k2) (Eq. 10);
- ``reranked_blocks``: d_J(p, g) = 1 - Σ_j min(V_pj, V_gj) / Σ_j max(V_pj, V_gj) = 1 - m / (2 - m) with
  m = Σ_j min(V_pj, V_gj) (Eqs. 9, 11), by an inverted index over V's columns, and
  ``d*(p, g) = (1 - λ) d_J(p, g) + λ d~(p, g)`` (Eq. 12) for each block of queries against the whole gallery.

V is sparse (an item's R* holds tens of items), so the memory is O(items x k1^2 / 2) besides the blocks; the time
is that of two passes of products over the pairs (the neighbourhoods, then d~ in Eq. 12) plus the sparse steps.
Every sum runs in increasing index order (V's row sums, the means of Eq. 10, the min-sums of Eq. 11), so that
identical neighbourhoods give bitwise identical distances: exact ties stay ties, ordered by gallery index.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from ..progress import progress_bar
from .knn import full_float32_products, products_engine, resolve_engine, similarities
from .rerank import KReciprocal
from .topk import sort_candidates, topk_stable

SHOWN_FROM = 10**8
"""Pairs of items from which the passes of products show a progress bar."""


def product_engine(engine: str) -> str:
    """The engine of the products: the kNN's, except faiss (whose search is no product of every pair)."""
    engine = resolve_engine(engine)
    return products_engine() if engine == "faiss" else engine


@dataclass
class NeighbourGraph:
    """Each item's neighbourhood in a set of items: ``lists`` (U, 1 + k) int64, the item itself then its k nearest
    others by (similarity desc, index asc) (Eq. 3); ``sims`` (U, k) float32 their similarities; ``row_min`` (U,)
    float64, each item's smallest similarity to another item (+inf where there is none)."""

    lists: np.ndarray
    sims: np.ndarray
    row_min: np.ndarray

    @property
    def items(self) -> int:
        return len(self.lists)

    def row_max_distance(self) -> np.ndarray:
        """(U,) float64: each row's largest distance ``max(0, 2 - 2 s_min)``, 1 where it is 0 (a set of one point,
        or of copies): the divisor of ``d~``."""
        largest = np.maximum(2.0 - 2.0 * self.row_min, 0.0)
        return np.where(largest > 0, largest, 1.0)


def neighbour_graph(x: torch.Tensor, k: int, memory_mb: float = 256.0, engine: str = "auto",
                    progress: bool = False) -> NeighbourGraph:
    """N(i, k) of every row of the l2-normalised ``x`` (U, D) among the others, by one blocked pass of products."""
    from .knn import block_rows_for, similarity_blocks

    engine = product_engine(engine)
    device = torch.device("cuda", torch.cuda.current_device()) if engine == "cuda" else torch.device("cpu")
    n = x.shape[0]
    k = min(k, n - 1)
    lists = np.empty((n, k + 1), dtype=np.int64)
    lists[:, 0] = np.arange(n)
    sims = np.empty((n, k), dtype=np.float32)
    row_min = np.empty(n, dtype=np.float64)
    on = x.to(device)
    bar = progress_bar(total=n, desc="re-ranking: neighbourhoods", unit="item",
                       disable=not progress or n * n < SHOWN_FROM)
    for start, s in similarity_blocks(on, on, block_rows_for(n, memory_mb), engine):
        stop = start + len(s)
        rows = torch.arange(stop - start, device=s.device)
        s[rows, rows + start] = float("inf")
        row_min[start:stop] = s.amin(dim=1).double().cpu().numpy()
        s[rows, rows + start] = float("-inf")
        if k:
            values, indices = topk_stable(s, k)
            lists[start:stop, 1:] = indices.cpu().numpy()
            sims[start:stop] = values.cpu().numpy()
        bar.update(stop - start)
    bar.close()
    return NeighbourGraph(lists, sims, row_min)


class PairSet:
    """A set of pairs (i, j) of items of a set of n, looked up many at a time (as keys ``i (n + 1) + j``, sorted)."""

    def __init__(self, rows: np.ndarray, cols: np.ndarray, n: int):
        self.n = n
        self.keys = np.sort(rows * (n + 1) + cols)

    def contains(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        keys = rows * (self.n + 1) + cols
        if not len(self.keys):
            return np.zeros(keys.shape, dtype=bool)
        where = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        return self.keys[where] == keys


def reciprocal_mask(lists: np.ndarray) -> np.ndarray:
    """R(i, k) (Eq. 4) as a mask over ``lists`` (U, K), each row N(i, K - 1) with i first: ``lists[i, m]`` is in
    R(i, K - 1) when i is in its own list."""
    n = len(lists)
    rows = np.broadcast_to(np.arange(n)[:, None], lists.shape)
    return PairSet(rows.ravel(), lists.ravel(), n).contains(lists, rows)  # (j, i) listed: i in N(j)


def expanded_sets(lists: np.ndarray, k1: int) -> np.ndarray:
    """R*(i, k1) (Eq. 6) of every item, from ``lists`` (U, 1 + k >= 1 + k1 or every other item): (U, W) int64 in
    increasing order, padded with U.

    R(q, h) (h = round(k1 / 2)) of each q in R(i, k1) joins when more than 2/3 of it lies in R(i, k1)."""
    n = len(lists)
    full = lists[:, :k1 + 1]
    width = full.shape[1]
    half = full[:, :min(round(k1 / 2) + 1, width)]
    in_full, in_half = reciprocal_mask(full), reciprocal_mask(half)
    rows_full = np.broadcast_to(np.arange(n)[:, None], full.shape)
    mine = PairSet(rows_full[in_full], full[in_full], n)  # (i, j): j in R(i, k1)
    parts = []
    step = max(1, 2**22 // (width * half.shape[1]))
    for start in range(0, n, step):
        candidates, kept = full[start:start + step], in_full[start:start + step]  # (b, K): R(i, k1) where kept
        their_half = half[candidates]  # (b, K, H): N(q, h) of each candidate q
        their_set = in_half[candidates]  # (b, K, H): which of those are in R(q, h)
        rows = np.arange(start, start + len(candidates))[:, None, None]
        in_mine = mine.contains(np.broadcast_to(rows, their_half.shape), their_half)
        count = (in_mine & their_set).sum(axis=2)
        size = their_set.sum(axis=2)
        joins = kept & (3 * count > 2 * size)  # (b, K)
        members = np.concatenate([np.where(kept, candidates, n),
                                  np.where(joins[..., None] & their_set, their_half, n).reshape(len(kept), -1)],
                                 axis=1)
        members.sort(axis=1)
        repeated = np.zeros(members.shape, dtype=bool)
        repeated[:, 1:] = members[:, 1:] == members[:, :-1]
        members[repeated] = n
        members.sort(axis=1)
        parts.append(members)
    width_used = max(int((part < n).sum(axis=1).max()) for part in parts)
    return np.concatenate([part[:, :width_used] for part in parts])


def member_sims(members: np.ndarray, graph: NeighbourGraph, x: torch.Tensor, memory_mb: float = 64.0) -> np.ndarray:
    """s(i, j) for every member j of row i (``members`` (U, W), padded with U; float64, 0 at the padding and at j = i):
    from ``graph`` where j is among i's listed neighbours (the products that ranked them), else a float32 dot product
    of the two rows of ``x``."""
    n, width = members.shape
    depth = graph.sims.shape[1]
    listed = (np.arange(n)[:, None] * (n + 1) + graph.lists[:, 1:]).ravel()  # (row, neighbour) as one key
    order = np.argsort(listed)
    listed, listed_sims = listed[order], graph.sims.ravel()[order]
    wanted = members < n
    wanted &= members != np.arange(n)[:, None]
    rows, cols = np.nonzero(wanted)
    keys = rows * (n + 1) + members[rows, cols]
    where = np.minimum(np.searchsorted(listed, keys), max(len(listed) - 1, 0))
    found = listed[where] == keys if depth else np.zeros(len(keys), dtype=bool)
    values = np.zeros(len(keys))
    values[found] = listed_sims[where[found]]
    missing = np.flatnonzero(~found)
    step = max(1, int(memory_mb * 2**20 / (8 * x.shape[1])))
    cpu = x.cpu()
    for start in range(0, len(missing), step):
        chosen = missing[start:start + step]
        left = cpu[torch.from_numpy(rows[chosen])]
        right = cpu[torch.from_numpy(members[rows[chosen], cols[chosen]])]
        values[chosen] = (left * right).sum(dim=1).double().numpy()
    sims = np.zeros(members.shape)
    sims[rows, cols] = values
    return sims


def encode(members: np.ndarray, sims: np.ndarray, row_max: np.ndarray) -> np.ndarray:
    """V (Eq. 7) over ``members`` (U, W; padded with U) whose similarities to their row's item are ``sims``:
    ``exp(-d~(i, j))`` normalised to sum 1 over R*(i), 0 at the padding; (U, W) float64."""
    n = len(members)
    valid = members < n
    distance = 2.0 - 2.0 * sims
    distance[members == np.arange(n)[:, None]] = 0.0
    weights = np.where(valid, np.exp(-(distance / row_max[:, None])), 0.0)
    total = np.cumsum(weights, axis=1)[:, -1]  # in index order
    return weights / total[:, None]


@dataclass
class SparseRows:
    """Rows of a sparse (U, U) matrix in coordinates sorted by (row, col): ``rows``, ``cols``, ``values``."""

    rows: np.ndarray
    cols: np.ndarray
    values: np.ndarray
    size: int

    def row_starts(self) -> np.ndarray:
        return np.searchsorted(self.rows, np.arange(self.size + 1))


def local_expansion(members: np.ndarray, v: np.ndarray, lists: np.ndarray, k2: int,
                    budget: int = 2**23) -> SparseRows:
    """V_i <- (1 / |N(i, k2)|) Σ_{j in N(i, k2)} V_j (Eq. 10), N(i, k2) = i and its k2 - 1 nearest others, summed in
    increasing index order."""
    n, width = members.shape
    group = np.sort(lists[:, :k2], axis=1)  # (U, c)
    count = group.shape[1]
    step = max(1, budget // max(1, count * width))
    rows, cols, values = [], [], []
    for start in range(0, n, step):
        sources = group[start:start + step]  # (b, c)
        their_cols = members[sources]  # (b, c, W): each row i, each source j in index order, j's members
        their_values = v[sources]
        targets = np.broadcast_to(np.arange(start, start + len(sources))[:, None, None], their_cols.shape)
        valid = their_cols < n
        keys = targets[valid] * n + their_cols[valid]
        unique, inverse = np.unique(keys, return_inverse=True)
        sums = np.bincount(inverse.reshape(-1), weights=their_values[valid], minlength=len(unique))  # in order
        rows.append(unique // n)
        cols.append(unique % n)
        values.append(sums / count)
    return SparseRows(np.concatenate(rows), np.concatenate(cols), np.concatenate(values), n)


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The concatenation of ``arange(s, s + l)`` for each start and length."""
    total = int(lengths.sum())
    out = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    out += np.arange(total, dtype=out.dtype)
    return out


def _final_distance(shared: np.ndarray, sims: np.ndarray, row_max: np.ndarray, settings: KReciprocal) -> np.ndarray:
    """d* (Eq. 12) from the min-sums ``shared`` (Eq. 11's m) and the float32 similarities ``sims`` of the same
    pairs; ``row_max`` broadcasts against them."""
    jaccard = 1.0 - shared / (2.0 - shared)  # Eq. 11
    distance = 2.0 - 2.0 * sims.astype(np.float64)
    with np.errstate(invalid="ignore"):  # a query's own row (similarity -inf) times λ = 0: NaN, left out after
        return jaccard * (1.0 - settings.lambda_value) + distance / row_max * settings.lambda_value


DENSE_FROM = 8
"""A block of queries gets d* for every gallery item when more than 1 / DENSE_FROM of its (query, item) pairs share a
column of V; below, only for those and the first k + 1 others in kNN order (``_sharing_and_first_others``)."""


def _smallest(final: np.ndarray, k: int, ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each row's k smallest values of ``final`` (b, W) by (value asc, id asc) (``ids`` (b, W), default the column),
    exact under ties: the k-th value by a partition, then everything at most that value sorted. Every row must hold
    at least k values below +inf."""
    b = len(final)
    kth = np.partition(final, k - 1, axis=1)[:, k - 1:k]
    rows, cols = np.nonzero(final <= kth)
    chosen_ids = cols if ids is None else ids[rows, cols]
    order = np.lexsort((chosen_ids, final[rows, cols], rows))
    rows, cols, chosen_ids = rows[order], cols[order], chosen_ids[order]
    rank = np.arange(len(rows)) - np.searchsorted(rows, np.arange(b))[rows]
    keep = rank < k
    return final[rows[keep], cols[keep]].reshape(b, k), chosen_ids[keep].reshape(b, k)


def _every_item(shared: np.ndarray, sims: np.ndarray, row_max: np.ndarray, k: int, settings: KReciprocal,
                rows: np.ndarray, mine: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """d* of every (query, gallery item) of the block, and each query's k smallest."""
    final = _final_distance(shared, sims, row_max[:, None], settings)
    if mine is not None:
        final[rows, mine[rows]] = np.inf
    return _smallest(final, k)


def _sharing_and_first_others(shared: np.ndarray, sims: torch.Tensor, row_max: np.ndarray, k: int,
                              settings: KReciprocal) -> tuple[np.ndarray, np.ndarray]:
    """Each query's k smallest d* from the items sharing a column of V with it and the first k + 1 others in kNN
    order (by index when λ = 0), which hold them: d* of an item sharing nothing is ``(1 - λ) + λ d~``, which never
    falls along the kNN order. Where the last of those others ties the k-th value, an item further down could tie it
    with a smaller index: that query is ranked over every item. ``sims`` has -inf at each query's own row."""
    b, n_gallery = shared.shape
    near_q, near_g = np.nonzero(shared)  # by query, then gallery position
    counts = np.bincount(near_q, minlength=b)
    extra = int(counts.max(initial=0))
    s = sims.numpy()
    near_sims = s[near_q, near_g]
    listed = min(k + 1, n_gallery)
    by_index = settings.lambda_value == 0
    if by_index:  # then every item sharing nothing has d* = 1: index order
        key = -torch.arange(n_gallery, dtype=torch.float32).repeat(b, 1)
        key[torch.isinf(sims)] = float("-inf")
    else:
        key = sims.clone()
    key[near_q, near_g] = float("-inf")
    found, plain = (t.numpy() for t in topk_stable(key, listed))
    plain_ok = np.isfinite(found)
    candidates = np.full((b, extra + listed), n_gallery, dtype=np.int64)
    candidate_sims = np.zeros(candidates.shape, dtype=np.float32)
    candidate_shared = np.zeros(candidates.shape)
    slot = np.arange(len(near_q)) - np.repeat(np.cumsum(counts) - counts, counts)
    candidates[near_q, slot] = near_g
    candidate_sims[near_q, slot] = near_sims
    candidate_shared[near_q, slot] = shared[near_q, near_g]
    candidates[:, extra:] = np.where(plain_ok, plain, n_gallery)
    candidate_sims[:, extra:] = np.take_along_axis(s, plain, 1)
    final = _final_distance(candidate_shared, candidate_sims, row_max[:, None], settings)
    final[candidates == n_gallery] = np.inf
    best, indices = _smallest(final, k, candidates)
    # an item below the last listed one in the kNN order has at least its d*: it can only tie the k-th
    unsure = plain_ok[:, -1] & (listed < n_gallery) & (not by_index) & (final[:, -1] <= best[:, -1])
    for row in np.flatnonzero(unsure):  # rare: that query against the whole gallery
        whole = _final_distance(shared[row], s[row], row_max[row], settings)
        whole[np.isinf(s[row])] = np.inf  # its own row
        best[row], indices[row] = (t[0] for t in _smallest(whole[None], k))
    return best, indices


def reranked_blocks(v: SparseRows, query_rows: np.ndarray, gallery_rows: np.ndarray, row_max: np.ndarray,
                    query_sims: Callable[[int, int], torch.Tensor], k: int, settings: KReciprocal,
                    own: np.ndarray | None = None, memory_mb: float = 256.0, pair_budget: int = 2**22,
                    progress: bool = False) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """Yield ``(first query, -d* (b, k) float64, gallery positions (b, k))`` block by block: each query's k gallery
    items of smallest ``d*`` (Eq. 12), ties by gallery position; ``own[i]`` (or -1) is query i's own gallery
    position, left out. ``query_sims(start, stop)`` gives the (b, G) float32 similarities of those queries to the
    gallery; ``query_rows`` and ``gallery_rows`` are the items' indices in V's set; ``k`` is at most the gallery
    items each query is ranked against.

    A gallery item that shares no column of V with the query has d_J = 1, so ``d* = (1 - λ) + λ d~``: among those,
    d* grows as the similarity falls (``2 - 2s`` is exact in float64), and they come in the exact kNN's order (by
    index when λ = 0). So d* is computed for the items that share a column and for the first k + 1 others in that
    order only; a row whose last such candidate ties the k-th value (an item further down could tie it with a
    smaller index) is ranked over the whole gallery instead."""
    n_gallery = len(gallery_rows)
    position = np.full(v.size, -1, dtype=np.int64)
    position[gallery_rows] = np.arange(n_gallery)
    # the inverted index: V's gallery rows by column, each column's rows in increasing gallery position
    keep = position[v.rows] >= 0
    order = np.lexsort((position[v.rows[keep]], v.cols[keep]))
    by_col = v.cols[keep][order]
    index_type = np.int32 if v.size * max(n_gallery, 1) < 2**31 else np.int64  # b x G targets fit: half the traffic
    col_gallery = position[v.rows[keep]][order].astype(index_type)
    col_values = v.values[keep][order]
    col_starts = np.searchsorted(by_col, np.arange(v.size + 1))
    col_sizes = np.diff(col_starts)
    row_starts = v.row_starts()
    pairs = np.bincount(v.rows, weights=col_sizes[v.cols], minlength=v.size)[query_rows]  # per query
    dense_rows = max(1, int(memory_mb * 2**20 / (24 * max(n_gallery, 1))))  # float32 sims, float64 min-sums, top-k
    bar = progress_bar(total=len(query_rows), desc="re-ranking", unit="query",
                       disable=not progress or len(query_rows) * n_gallery < SHOWN_FROM)
    start = 0
    while start < len(query_rows):
        stop = start + 1  # as many queries as the budgets allow, at least one
        budget = pairs[start]
        while stop < len(query_rows) and stop - start < dense_rows and budget + pairs[stop] <= pair_budget:
            budget += pairs[stop]
            stop += 1
        queries, b = query_rows[start:stop], stop - start
        lengths = row_starts[queries + 1] - row_starts[queries]
        entries = _ranges(row_starts[queries], lengths)  # V's entries of each query, by (query, column)
        entry_col = v.cols[entries]
        spans = col_sizes[entry_col]
        # each entry (query, column j, V_qj) against the gallery rows g of column j: min(V_qj, V_gj) added at (q, g)
        matched = _ranges(col_starts[entry_col], spans)
        mins = np.minimum(np.repeat(v.values[entries], spans), col_values[matched])
        target = np.repeat(np.repeat(np.arange(b, dtype=index_type) * n_gallery, lengths), spans) + col_gallery[matched]
        shared = np.bincount(target, weights=mins, minlength=b * n_gallery).reshape(b, n_gallery)  # in column order
        sims = query_sims(start, stop).cpu()
        mine = None if own is None else own[start:stop]
        rows = np.arange(b) if mine is None else np.flatnonzero(mine >= 0)
        if mine is not None:
            shared[rows, mine[rows]] = 0.0
            sims[rows, mine[rows]] = float("-inf")
        if np.count_nonzero(shared) * DENSE_FROM > shared.size:
            best, indices = _every_item(shared, sims.numpy(), row_max[queries], k, settings, rows, mine)
        else:
            best, indices = _sharing_and_first_others(shared, sims, row_max[queries], k, settings)
        bar.update(b)
        yield start, torch.from_numpy(-best), torch.from_numpy(indices)
        start = stop
    bar.close()


def encode_all(graph: NeighbourGraph, x: torch.Tensor, settings: KReciprocal) -> SparseRows:
    """V after the local query expansion (Eqs. 6, 7, 10) of every item of ``graph`` (``x``: their embeddings)."""
    members = expanded_sets(graph.lists, settings.k1)
    v = encode(members, member_sims(members, graph, x), graph.row_max_distance())
    return local_expansion(members, v, graph.lists, settings.k2)


def k_reciprocal_knn(query: torch.Tensor, gallery: torch.Tensor, k: int, self_index: torch.Tensor | None,
                     settings: KReciprocal, memory_mb: float = 256.0, engine: str = "auto",
                     progress: bool = False) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """``iter_knn``'s blocks, ranked by ``d*`` (Eq. 12) instead of similarity: the neighbourhoods live in the set of
    the gallery and the queries that are not in it (``self_index[i]``: query i's gallery row, or -1), queries first.
    Values are ``-d*`` (float64); ``k`` as ``iter_knn``'s."""
    from .rerank import check_items

    own = None if self_index is None else self_index.numpy().astype(np.int64)
    outside = np.arange(len(query)) if own is None else np.flatnonzero(own < 0)
    items = torch.cat([query[torch.from_numpy(outside)], gallery]) if len(outside) else gallery
    check_items(settings, items.shape[0], "queries and gallery items")
    query_rows = np.empty(len(query), dtype=np.int64)
    query_rows[outside] = np.arange(len(outside))
    if own is not None:
        inside = own >= 0
        query_rows[inside] = len(outside) + own[inside]
    gallery_rows = len(outside) + np.arange(len(gallery))
    graph = neighbour_graph(items, max(settings.k1, settings.k2 - 1), memory_mb, engine, progress)
    v = encode_all(graph, items, settings)
    engine = product_engine(engine)
    device = torch.device("cuda", torch.cuda.current_device()) if engine == "cuda" else torch.device("cpu")
    on_device = gallery.to(device)

    def query_sims(start: int, stop: int) -> torch.Tensor:
        with full_float32_products():
            return similarities(query[start:stop].to(device), on_device, engine)

    yield from reranked_blocks(v, query_rows, gallery_rows, graph.row_max_distance(), query_sims, k, settings, own,
                               memory_mb, progress=progress)


def k_reciprocal_search(queries: torch.Tensor, gallery: torch.Tensor, k: int, settings: KReciprocal,
                        engine: str = "auto", progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Each query re-ranked alone against ``gallery`` (the set of the gallery and that query, the query first):
    ``(1 - d*, gallery ids)``, each (Q, k), best first. The gallery's neighbourhoods are found once; each query's
    joins them (an item's k nearest among the gallery and the query), so no answer depends on the other queries."""
    from .rerank import check_items

    n = gallery.shape[0]
    check_items(settings, n + 1, "gallery items and the query", search=True)
    depth = max(settings.k1, settings.k2 - 1)
    base = neighbour_graph(gallery, depth, engine=engine)
    engine = product_engine(engine)
    with full_float32_products():
        to_gallery = similarities(queries, gallery, engine).cpu()  # (Q, G)
    kept = min(depth, n)
    scores = np.empty((len(queries), min(k, n)))
    ids = np.empty((len(queries), min(k, n)), dtype=np.int64)
    for q in progress_bar(range(len(queries)), desc="re-ranking", unit="query", disable=not progress):
        s = to_gallery[q]
        # the gallery items' lists with the query (index 0) among the candidates, the gallery's indices moved by 1
        values = torch.cat([s[:, None], torch.from_numpy(base.sims)], dim=1)
        indices = torch.cat([torch.zeros(n, 1, dtype=torch.long), torch.from_numpy(base.lists[:, 1:]) + 1], dim=1)
        values, indices = sort_candidates(values, indices)
        own_values, own_indices = topk_stable(s[None], kept)
        lists = np.empty((n + 1, kept + 1), dtype=np.int64)
        lists[:, 0] = np.arange(n + 1)
        lists[0, 1:] = own_indices[0].numpy() + 1
        lists[1:, 1:] = indices[:, :kept].numpy()
        row_min = np.concatenate([[float(s.min())], np.minimum(base.row_min, s.double().numpy())])
        graph = NeighbourGraph(lists, np.concatenate([own_values.numpy(), values[:, :kept].numpy()]), row_min)
        v = encode_all(graph, torch.cat([queries[q:q + 1], gallery]), settings)
        def own_sims(start: int, stop: int, s: torch.Tensor = s) -> torch.Tensor:
            return s[None]

        _, values, indices = next(reranked_blocks(v, np.array([0]), np.arange(1, n + 1), graph.row_max_distance(),
                                               own_sims, min(k, n), settings))
        scores[q], ids[q] = 1.0 + values[0].numpy(), indices[0].numpy()
    return scores, ids
