"""Exact row-wise top-k of a block of similarities, ordered by (similarity desc, index asc), ties included.

The kNN engines (``knn.py``) and the k-reciprocal re-ranking select their neighbours here. A row at least
``2 GROUP (k + 1)`` wide is never selected over whole: ``grouped_topk`` keeps the k + 1 groups of columns with the
largest maxima and selects among their members (about 8 (k + 1) values instead of the row), and the rare rows it
cannot vouch for are selected over the whole row. The same selection is written twice:

- ``grouped_topk`` in torch, for a GPU (it never synchronises with the host: the ``cuda`` engine queues it) and for
  CPUs where numpy selects slowly;
- ``grouped_topk_on_host`` for CPU tensors where numpy selects with SIMD (``numpy_selects_fast``): the two
  selections and the sort by numpy (``np.argpartition``, and ``np.sort`` of keys that hold each value's order above
  its column, which orders ties by index in the same sort), the maxima and the gathers by torch. On an AMD EPYC
  (family 26) at SOP's shape (369 rows of 60,502, k = 1000, ``benchmarks/topk_selection.py``) it took 25 ms a
  block where torch's takes 42 (0.25 and 0.42 of the block's product): torch's CPU top-k runs
  ``std::nth_element`` on pairs of value and index, numpy 2's ``argpartition`` the vectorised selection of
  x86-simd-sort (AVX2 or AVX-512). Without those (numpy 1.26, or a CPU without AVX2) numpy's selection is slower
  than torch's (one ``argpartition`` of the group maxima took 25 ms there, against 4 with AVX2 and torch's 11),
  and CPU tensors stay with ``grouped_topk``.

Both give the same neighbours, values and ``unsure`` rows (tested, ``tests/test_metrics.py``); the host's rows
come in ``topk_stable``'s order, torch's may hold equal values in another, which ``order_ties_by_index`` then
settles. On one thread of an Intel Xeon (184 rows a block, as the kNN's threads take them) the keys' sort made the
host's selection 0.88 of what it took with ``np.argsort`` and ``order_ties_by_index`` (2026-12-03).
"""

from __future__ import annotations

import importlib
import platform
from functools import cache

import numpy as np
import torch

GROUP = 8  # groups per row in the grouped selection of ``topk_stable``


@cache
def numpy_selects_fast() -> bool:
    """Whether numpy selects with SIMD here: numpy >= 2 on an x86 CPU with AVX2 in numpy's dispatch (``X86_V3``
    from numpy 2.4, ``AVX2`` before; off where ``NPY_DISABLE_CPU_FEATURES`` names it), whose ``argpartition`` and
    ``argsort`` are then x86-simd-sort's. Elsewhere (numpy 1.26, x86 CPUs without AVX2, ARM, which is not measured)
    torch selects."""
    if int(np.__version__.split(".")[0]) < 2 or platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    features = _numpy_cpu_features()
    return bool(features.get("X86_V3", features.get("AVX2", False)))


def _numpy_cpu_features() -> dict[str, bool]:
    """numpy's table of the CPU features its dispatch uses ({} where numpy has none at that place)."""
    try:
        return dict(importlib.import_module("numpy._core._multiarray_umath").__cpu_features__)
    except (ImportError, AttributeError):
        return {}


def topk_stable(sims: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise top-``k`` of ``sims`` ordered by (similarity desc, index asc), exact under ties.

    Wide rows go through the grouped selection (on the host for CPU tensors), which never selects over the whole
    row; the rare rows it cannot vouch for are redone over the whole row.
    """
    if too_narrow_to_group(sims.shape[1], k):
        return whole_row_topk(sims, k)
    if sims.device.type == "cpu" and numpy_selects_fast() and sims.shape[1] <= COLUMN_BITS:
        values, indices, unsure = grouped_topk_on_host(sims, k)  # in order, ties included
        if unsure.any():
            rows = unsure.nonzero().squeeze(1)
            values[rows], indices[rows] = whole_row_topk(sims[rows], k)
        return values, indices
    values, indices, unsure = grouped_topk(sims, k)
    if unsure.any():
        rows = unsure.nonzero().squeeze(1)
        values[rows], indices[rows] = _select_whole_rows(sims[rows], k)
    return order_ties_by_index(values, indices)


def too_narrow_to_group(width: int, k: int) -> bool:
    """Rows of ``width`` hold fewer than the 2 (k + 1) groups ``grouped_topk`` needs: they are selected whole."""
    return width // GROUP < 2 * (k + 1)


def whole_row_topk(sims: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``topk_stable`` by one selection over each whole row."""
    return order_ties_by_index(*_select_whole_rows(sims, k))


def grouped_topk(sims: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The top-``k`` of each row by a grouped selection, sorted by value (ties in any order), and the rows for which
    it may be wrong (``unsure``, (b,) bool), with no synchronisation with the host (rows at least ``2 GROUP (k + 1)``
    wide).

    Column c < G·w (w = n // G) belongs to group ``c mod w``, so each group holds G columns a stride w apart and its
    maximum is one element-wise maximum of G contiguous slices; the k+1 groups with the largest maxima are kept,
    and the top-k is taken among their G·(k+1) members and the (< G) leftover columns. That is exact whenever the
    smallest kept maximum M is below the k-th value found (every dropped column is at most M) and the k-th and
    (k+1)-th candidates differ (no tie crosses the boundary); the other rows are ``unsure``.
    """
    strided, main = _groups(sims)
    group_max, kept = strided.amax(dim=1).topk(k + 1, dim=1, sorted=False)  # (b, k + 1)
    members = _members(strided, kept)
    values, position = torch.cat([members, sims[:, main:]], dim=1).topk(k + 1, dim=1)
    return _first_k(values, _columns(position, kept, strided.shape[2], main), group_max.amin(dim=1), k)


def grouped_topk_on_host(sims: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``grouped_topk`` for a CPU tensor, its two selections and its sort by numpy: the same values, indices and
    ``unsure`` rows, and each row already in ``topk_stable``'s order, equal values by increasing index.

    Each selection partitions the row in increasing order and keeps its last k + 1 places, the smallest of them
    first (numpy, like torch's ``topk``, counts NaN as the largest value). The kept groups' members are gathered
    group by group into one array with the leftover columns (a member's place then gives its column by a shift),
    and the k + 1 best are put in order by one sort of 64-bit keys (``_order_keys``: the value's order above its
    column's), which orders ties by index in the same sort (``order_ties_by_index`` is not needed)."""
    sims = sims.detach()
    b, n = sims.shape
    strided, main = _groups(sims)
    group_max = strided.amax(dim=1)  # (b, w)
    width, kept_count = group_max.shape[1], k + 1
    kept = np.argpartition(group_max.numpy(), width - kept_count, axis=1)[:, width - kept_count:]  # (b, k + 1)
    smallest_kept = group_max.gather(1, torch.from_numpy(kept[:, :1]))[:, 0]  # the partition puts it first
    kept = np.sort(kept, axis=1)  # gathered in increasing column order: faster
    members = GROUP * kept_count
    candidates = torch.empty(b, members + n - main, dtype=sims.dtype)  # group by group, then the leftover columns
    group_major = candidates[:, :members].view(b, kept_count, GROUP)
    torch.gather(strided.transpose(1, 2), 1, torch.from_numpy(kept)[:, :, None].expand(-1, -1, GROUP), out=group_major)
    candidates[:, members:] = sims[:, main:]
    last = candidates.shape[1] - kept_count
    best = np.argpartition(candidates.numpy(), last, axis=1)[:, last:]  # (b, k + 1) places, in no order
    values = np.take_along_axis(candidates.numpy(), best, axis=1)
    group = np.take_along_axis(kept, np.minimum(best // GROUP, kept_count - 1), axis=1)
    best_columns = np.where(best >= members, best - members + main, (best % GROUP) * width + group)
    ordered = torch.from_numpy(np.sort(_order_keys(values, best_columns), axis=1)[:, ::-1].copy())
    columns = COLUMN_BITS - (ordered & COLUMN_BITS)
    return _first_k(sims.gather(1, columns), columns, smallest_kept, k)


COLUMN_BITS = 2**32 - 1  # the low half of ``_order_keys``'s keys


def _order_keys(values: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """int64 keys whose increasing order is (similarity asc, column desc): the float32 value's bits made an integer
    of the same order (NaN above +inf; -0.0 as 0.0, which compares equal to it) in the high half, the column's
    complement in the low half. Columns must be below 2^32."""
    values = values + np.float32(0.0)  # -0.0 + 0.0 is 0.0
    bits = values.view(np.int32)
    order = (bits ^ ((bits >> 31) & 0x7FFFFFFF)).astype(np.int64)  # negative floats' bits reversed, as two's complement
    order[values != values] = 2**31 - 1  # NaN, of either sign
    return (order << 32) | (COLUMN_BITS - columns)


def _groups(sims: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The first G·w columns seen as (b, G, w), group r being column r of every slice, and G·w."""
    width = sims.shape[1] // GROUP
    main = GROUP * width
    return sims[:, :main].unflatten(1, (GROUP, width)), main


def _members(strided: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """The G members of each kept group, (b, G·(k + 1)): slice by slice, the kept groups in ``kept``'s order."""
    return strided.gather(2, kept[:, None, :].expand(-1, GROUP, -1)).flatten(1)


def _columns(position: torch.Tensor, kept: torch.Tensor, width: int, main: int) -> torch.Tensor:
    """The row's columns of positions among the candidates (the kept groups' members, then the leftover columns)."""
    kept_count = kept.shape[1]
    members = GROUP * kept_count
    slice_, group = position // kept_count, position % kept_count
    columns = slice_ * width + kept.gather(1, group)
    return torch.where(position >= members, position - members + main, columns)


def _first_k(values: torch.Tensor, indices: torch.Tensor, smallest_kept: torch.Tensor,
             k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The first k of the k + 1 best candidates (sorted by value) and the rows the grouped selection cannot vouch
    for: a tie across the k-th place, or a kept group's maximum (``smallest_kept``, the least of them) that reaches
    the k-th value, so that a dropped column could too."""
    unsure = (values[:, k] == values[:, k - 1]) | (smallest_kept >= values[:, k - 1])
    return values[:, :k].contiguous(), indices[:, :k].contiguous(), unsure


def _select_whole_rows(sims: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-k set of each row by one selection over the whole row, sorted by value (ties inside it in any
    order): a tie crosses the k boundary exactly when the (k+1)-th value equals the k-th, and only those rows
    are redone by a stable sort."""
    if k >= sims.shape[1]:
        return sims.topk(k, dim=1)
    values, indices = sims.topk(k + 1, dim=1)  # sorted by value; the order among equal values is arbitrary
    straddling = values[:, k] == values[:, k - 1]
    values, indices = values[:, :k].contiguous(), indices[:, :k].contiguous()
    if straddling.any():
        rows = straddling.nonzero().squeeze(1)
        order = torch.sort(sims[rows], dim=1, descending=True, stable=True).indices[:, :k]
        indices[rows] = order
        values[rows] = sims[rows].gather(1, order)
    return values, indices


def order_ties_by_index(values: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows already sorted by decreasing value: put equal values in increasing index order (only rows with
    ties are touched)."""
    tied = (values[:, 1:] == values[:, :-1]).any(dim=1)
    if tied.any():
        rows = tied.nonzero().squeeze(1)
        values[rows], indices[rows] = sort_candidates(values[rows], indices[rows])
    return values, indices


def sort_candidates(values: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Order each row's candidates (in any order) by (similarity desc, index asc)."""
    by_index, perm = indices.sort(dim=1)
    values = values.gather(1, perm)
    order = torch.sort(values, dim=1, descending=True, stable=True).indices
    return values.gather(1, order), by_index.gather(1, order)
