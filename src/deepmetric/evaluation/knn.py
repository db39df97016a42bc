"""Exact k-nearest neighbours by cosine similarity, in blocks of queries, with deterministic ties.

Memory is bounded by ``block_rows x n_gallery`` similarities at a time (about ``memory_mb``), so an
SOP-sized set (60,502 x 60,502) never materialises its full similarity matrix; the CPU engines write every block
into one buffer (``similarity_blocks``). Neighbours are ordered by decreasing similarity and, among exactly equal
similarities, by increasing gallery index, and a query's own gallery row (``self_index``) is removed by index, never
by position: the same similarities always give the same neighbours. The similarities are float32 products, and their
last bit depends on the product kernel (BLAS picks different kernels for blocks of a few rows than for large ones,
and the faiss engine re-scores by another kernel): two set-ups can order neighbours whose similarities differ by a
rounding error differently, which moves the metrics of an SOP-sized set in about the fifth decimal.

Four engines:

- ``torch``: a block of similarities by one torch matrix product, then the grouped top-k of
  ``topk_stable`` (``topk.py``: numpy's selections where numpy has them with SIMD). With several threads
  (``knn_workers``) each thread takes whole blocks, product and selection on one thread, so that no core waits
  while numpy selects on one (``_blocks_in_parallel``); on 2 cores of an AMD EPYC its kNN at SOP scale (k = 1000)
  took 1.10 times its products alone (one block on both threads at a time), on an Intel Xeon (``auto`` there)
  RATIO times the bare products (1.62 one block at a time);
- ``numpy``: the same, with the block's product by numpy's BLAS (OpenBLAS in numpy's wheels). torch's CPU
  wheels multiply with MKL, which takes a slow path on CPUs not made by Intel: on an AMD EPYC, numpy's
  product is 1.5 to 2 times as fast and the numpy engine's kNN takes 1.29 times the bare products
  (docs/benchmarks/evaluation.md). ``auto`` picks numpy there and torch otherwise, including on the first
  generation of AMD's Zen cores, where MKL's products were the faster (``products_engine``);
- ``faiss`` (when installed): faiss' exact inner-product search proposes ``k + margin`` candidates, whose
  similarities are recomputed with torch and sorted by the rule above; a row whose candidates might not
  contain the true top-k (ties reaching the end of the candidate list) is recomputed by the torch engine.
  It is slower on CPU (2.3 to 3.1 times the bare products: the re-scoring gathers k rows of the gallery per
  query) and kept for comparison (docs/benchmarks/evaluation.md);
- ``cuda``: the torch engine on the current CUDA device: the gallery is copied there once, each block's
  products and top-k run there in full float32 (TF32 is switched off for the products, whatever the caller
  chose), and only the (b, k) results come back. Blocks are queued one ahead and nothing inside a block waits
  for the host (``_queued_blocks``), each ``CUDA_BLOCK_SCALE`` times the CPU engines' rows. ``auto`` picks it
  wherever torch sees a CUDA device.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import DeepMetricError
from ..hardware import cpu_info
from .engines import KNN_ENGINES
from .topk import grouped_topk, sort_candidates, too_narrow_to_group, topk_stable, whole_row_topk

FAISS_MARGIN = 16


def faiss_available() -> bool:
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def executes_avx_at_half_width() -> bool:
    """Whether this is a first-generation Zen core (AMD family 23 before model 0x30: Zen and Zen+; Hygon's
    Dhyana, family 24, is the same core), which splits each 256-bit AVX2 operation into two 128-bit halves.
    There MKL's generic path for CPUs not made by Intel loses little by its narrower kernels: on 2 cores of an EPYC of
    family 23, model 1, torch's products of an SOP-sized set took 67.6 s, OpenBLAS' 78.5 s
    (docs/benchmarks/evaluation.md). Zen 2 (family 23 from model 0x30) and later execute 256 bits at once, as the
    measured families 25 and 26 do, and OpenBLAS' products are the faster there."""
    try:
        family, model = int(cpu_info("cpu family")), int(cpu_info("model"))
    except ValueError:  # no such fields (other systems, ARM CPUs)
        return False
    return (family == 23 and model < 0x30) or (family == 24 and cpu_info("vendor_id") == "HygonGenuine")


def products_engine() -> str:
    """The engine whose matrix products are the faster here: numpy's BLAS where torch multiplies with MKL on an
    x86 CPU not made by Intel (MKL's slow path there) whose cores execute AVX2 at full width, torch's otherwise
    (Intel, first-generation Zen, an unknown vendor)."""
    vendor = cpu_info("vendor_id")
    mkl_slow_path = torch.backends.mkl.is_available() and vendor not in ("", "GenuineIntel")
    return "numpy" if mkl_slow_path and not executes_avx_at_half_width() else "torch"


def resolve_engine(engine: str) -> str:
    if engine == "auto":  # the faiss engine is slower on CPU (docs/benchmarks/evaluation.md)
        return "cuda" if torch.cuda.is_available() else products_engine()
    if engine not in KNN_ENGINES:
        raise DeepMetricError(f"kNN engine must be one of {', '.join(KNN_ENGINES)}, got '{engine}'")
    if engine == "faiss" and not faiss_available():
        raise DeepMetricError("kNN engine 'faiss' asked for, but faiss is not installed (pip install faiss-cpu)")
    if engine == "cuda" and not torch.cuda.is_available():
        raise DeepMetricError("kNN engine 'cuda' asked for, but torch sees no CUDA device")
    return engine


@contextmanager
def full_float32_products() -> Iterator[None]:
    """Products in IEEE float32 (no TF32 on CUDA) inside the block, the caller's choice restored after it."""
    chosen = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(chosen)


def similarities(query: torch.Tensor, gallery: torch.Tensor, engine: str = "torch",
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """``query @ gallery.T`` (float32) by torch's product (on the tensors' device) or numpy's BLAS (CPU); into
    ``out`` (a contiguous (len(query), len(gallery)) tensor of the products' dtype, outside autograd) when given:
    a block's similarities written where the previous block's were, instead of into new memory, whose first touch
    cost about a fifth of torch's product on an Intel Xeon (docs/benchmarks/evaluation.md)."""
    if out is not None:
        if engine == "numpy":
            np.matmul(query.detach().numpy(), gallery.detach().numpy().T, out=out.numpy())
            return out
        return torch.mm(query.detach(), gallery.detach().t(), out=out)
    if engine == "numpy":
        return torch.from_numpy(query.detach().numpy() @ gallery.detach().numpy().T)
    return query @ gallery.t()


def similarity_blocks(query: torch.Tensor, gallery: torch.Tensor, block: int,
                      engine: str = "torch") -> Iterator[tuple[int, torch.Tensor]]:
    """``(first row, similarities of query[first:first + block] to gallery)`` block by block, in full float32. On
    the host every block is written into one buffer (``similarities(out=)``; the last, shorter block into its first
    rows), so a block is valid only until the next is asked for; on a GPU, whose allocator reuses its own memory,
    each block is a new tensor."""
    on_host = gallery.device.type == "cpu"
    buffer = torch.empty(min(block, len(query)), len(gallery), dtype=query.dtype) if on_host else None
    for start in range(0, len(query), block):
        rows = query[start:start + block]
        with full_float32_products():
            sims = similarities(rows, gallery, engine, None if buffer is None else buffer[:len(rows)])
        yield start, sims


def block_rows_for(n_gallery: int, memory_mb: float = 256.0) -> int:
    """Queries per block so that one block of float32 similarities stays near ``memory_mb``."""
    return max(1, int(memory_mb * 2**20 / (4 * max(n_gallery, 1) * 3)))


CUDA_BLOCK_SCALE = 4
"""The ``cuda`` engine's blocks hold this many times the CPU engines' rows (``memory_mb`` x 4 of device memory):
fewer, larger blocks keep a GPU busy. On an H200 at SOP scale (60,502 x 512, k = 1000; ``benchmarks/knn_cuda.py``,
2026-11-28) the queued kNN took 2.13 times the bare products at 369 rows a block, 1.40 at 1,476 (x 4) and 1.48 at
5,904 (x 16)."""


def _product_block(query: torch.Tensor, gallery: torch.Tensor, k: int, own: torch.Tensor | None,
                   engine: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
    """One block of the torch or numpy engine: the similarities, the query's own row removed, the top-k."""
    return topk_stable(_masked_similarities(query, gallery, own, engine), k)


def _masked_similarities(query: torch.Tensor, gallery: torch.Tensor, own: torch.Tensor | None,
                         engine: str = "torch") -> torch.Tensor:
    """A block's similarities with each query's own gallery row (``own``, -1 for none) at -inf."""
    return _without_own_rows(similarities(query, gallery, engine), own)


def _without_own_rows(sims: torch.Tensor, own: torch.Tensor | None) -> torch.Tensor:
    """``sims`` with each query's own gallery row (``own``, -1 for none) at -inf, in place."""
    if own is not None:  # a scatter, not an index of the rows with one: no synchronisation with a GPU
        column = own.clamp_min(0)[:, None]
        sims.scatter_(1, column, torch.where(own[:, None] >= 0, float("-inf"), sims.gather(1, column)))
    return sims


@dataclass
class _QueuedBlock:
    """A block whose top-k is queued on the device, its copies to the host with it."""

    start: int
    sims: torch.Tensor  # (b, n) on the device, own rows masked: the unsure rows are redone from these, not from a
    # new product of those rows alone, whose kernel could round their similarities otherwise than the block's
    values: torch.Tensor  # (b, k) on the host once ``done``
    indices: torch.Tensor  # (b, k) int32
    unsure: torch.Tensor  # (b,) bool: rows the grouped selection cannot vouch for
    done: torch.cuda.Event | None


def _to_host(tensor: torch.Tensor) -> torch.Tensor:
    """A copy queued from the GPU into pinned host memory (the tensor itself on the CPU)."""
    if tensor.device.type != "cuda":
        return tensor
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    return host.copy_(tensor, non_blocking=True)


def _queue_block(query: torch.Tensor, gallery: torch.Tensor, own: torch.Tensor | None, start: int,
                 k: int) -> _QueuedBlock:
    """Queue a block's products, grouped top-k, tie order and copies to the host, without waiting for the device."""
    with full_float32_products():
        sims = _masked_similarities(query, gallery, own)
    if too_narrow_to_group(sims.shape[1], k):  # the whole-row selection (it synchronises)
        values, indices = whole_row_topk(sims, k)
        unsure = torch.zeros(len(sims), dtype=torch.bool, device=sims.device)
    else:
        values, indices, unsure = grouped_topk(sims, k)
        values, indices = sort_candidates(values, indices)  # ties by index in every row: cheaper than asking which
    done = torch.cuda.Event() if sims.device.type == "cuda" else None
    queued = _QueuedBlock(start, sims, _to_host(values), _to_host(indices.int()), _to_host(unsure), done)
    if done is not None:
        done.record()
    return queued


def _finish_block(block: _QueuedBlock, k: int) -> tuple[int, torch.Tensor, torch.Tensor]:
    """Wait for a queued block, redo its unsure rows over their whole rows, and return it as ``iter_knn`` yields."""
    if block.done is not None:
        block.done.synchronize()
    # copies out of the pinned buffers, which then go back to torch's pinned allocator for the blocks to come: pinned
    # memory stays a few blocks' worth however long the caller keeps the results (allocating it is slow)
    values, indices = block.values.clone(), block.indices.long()
    if block.unsure.any():
        rows = block.unsure.nonzero().squeeze(1)
        fixed_values, fixed_indices = whole_row_topk(block.sims[rows.to(block.sims.device)], k)
        values[rows], indices[rows] = fixed_values.cpu(), fixed_indices.cpu()
    return block.start, values, indices


def _queued_blocks(query: torch.Tensor, gallery: torch.Tensor, k: int, self_index: torch.Tensor | None, block: int,
                   device: torch.device) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """The ``cuda`` engine: block i + 1 is queued on the device before block i is read back, so that the device
    never waits for the host between blocks (no synchronisation inside a block: the rows the grouped selection
    cannot vouch for are redone from the block's similarities when it is read, ties are ordered in every row, and the
    results come back as int32 indices into pinned memory). The gallery goes to the device once (and serves as the
    queries when they are the same tensor); each block of queries goes on its own. Two blocks' similarities are held
    at a time, within the three matrices ``block_rows_for`` budgets for."""
    same = query is gallery
    gallery = gallery.to(device)
    queued: _QueuedBlock | None = None
    for start in range(0, query.shape[0], block):
        q = gallery[start:start + block] if same else query[start:start + block].to(device)
        own = None if self_index is None else self_index[start:start + block].to(device)
        following = _queue_block(q, gallery, own, start, k)
        if queued is not None:
            yield _finish_block(queued, k)
        queued = following
    if queued is not None:
        yield _finish_block(queued, k)


class _FaissSearcher:
    """faiss candidates, re-scored with torch and ordered by the same rule as the torch engine."""

    def __init__(self, gallery: torch.Tensor):
        import faiss

        self.gallery = gallery
        self.index = faiss.IndexFlatIP(gallery.shape[1])
        self.index.add(np.ascontiguousarray(gallery.numpy(), dtype=np.float32))

    def rescore(self, query: torch.Tensor, candidates: torch.Tensor, memory_mb: float = 32.0) -> torch.Tensor:
        """Similarities of each query to its candidates, by the same float32 dot products as the torch engine,
        a few rows at a time (the gathered gallery rows are rows x width x D floats)."""
        width, dim = candidates.shape[1], self.gallery.shape[1]
        rows = max(1, int(memory_mb * 2**20 / (4 * width * dim)))
        exact = torch.empty(candidates.shape)
        for s in range(0, len(candidates), rows):
            chosen = self.gallery[candidates[s:s + rows].clamp_min(0)]  # (r, width, D)
            exact[s:s + rows] = torch.einsum("rd,rwd->rw", query[s:s + rows], chosen)
        exact[candidates < 0] = float("-inf")
        return exact

    def block(self, query: torch.Tensor, k: int, own: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.gallery.shape[0]
        width = min(n, k + FAISS_MARGIN + (1 if own is not None else 0))
        scores, found = self.index.search(np.ascontiguousarray(query.numpy(), dtype=np.float32), width)
        candidates = torch.from_numpy(found).long()  # (b, width)
        exact = self.rescore(query, candidates)
        if own is not None:
            exact[candidates == own[:, None]] = float("-inf")
        values, indices = sort_candidates(exact, candidates)
        if width == n:
            return values[:, :k], indices[:, :k]
        # The candidates hold the true top-k unless something left out could tie or beat the k-th: faiss
        # scored everything it left out at most as high as its last candidate, so demand a gap over that.
        left_out_bound = torch.from_numpy(scores[:, -1]).float()
        unsure = values[:, k - 1] <= left_out_bound + 1e-5
        values, indices = values[:, :k].clone(), indices[:, :k].clone()
        if unsure.any():
            rows = unsure.nonzero().squeeze(1)
            fixed = _product_block(query[rows], self.gallery, k, None if own is None else own[rows])
            values[rows], indices[rows] = fixed
        return values, indices


def knn_workers() -> int:
    """Threads the torch engine's kNN takes blocks on: torch's thread count (``torch.set_num_threads``)."""
    return torch.get_num_threads()


@contextmanager
def _single_threaded_pool(workers: int) -> Iterator[ThreadPoolExecutor]:
    """``workers`` threads whose torch operations run on one thread each. ``torch.set_num_threads(1)`` inside a
    thread sets that thread's OpenMP and MKL thread counts and the count threads started later take at their first
    torch operation; the latter is put back once the workers have started (the calling thread keeps its own
    throughout)."""
    chosen = torch.get_num_threads()
    started = threading.Barrier(workers + 1)

    def one_thread() -> None:
        torch.get_num_threads()  # torch sets a thread's count from the process' at its first use: let that be now,
        torch.set_num_threads(1)  # not after the count is put back
        started.wait()

    with ThreadPoolExecutor(workers, initializer=one_thread, thread_name_prefix="deepmetric-knn") as pool:
        for _ in range(workers):  # each waits in its initializer, so each submission starts a thread of its own
            pool.submit(lambda: None)
        started.wait()
        torch.set_num_threads(chosen)
        yield pool


def _blocks_in_parallel(query: torch.Tensor, gallery: torch.Tensor, k: int, self_index: torch.Tensor | None,
                        block: int, workers: int) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """The torch engine on a CPU with several threads: ``workers`` threads take the blocks in turn, each a block's
    product and selection on one thread into a buffer of its own, and the blocks are yielded in order.

    One block's product on all threads and then its selection, which numpy runs on one, leaves the other cores idle
    for a third of the time; on one thread each, every core multiplies and selects. Each block is ``memory_mb /
    workers`` (``workers`` blocks in flight hold what one block does in the serial loop). No thread starts an
    OpenMP team of its own, so no team's waiting worker spins on a core the others need. The products run in full
    float32 for as long as the blocks do (the caller's choice restored when the last is yielded)."""
    buffers = [torch.empty(min(block, len(query)), len(gallery), dtype=query.dtype) for _ in range(workers)]

    def knn_block(start: int, buffer: torch.Tensor) -> tuple[int, torch.Tensor, torch.Tensor]:
        rows = query[start:start + block]
        sims = similarities(rows, gallery, "torch", buffer[:len(rows)])
        own = None if self_index is None else self_index[start:start + block]
        return start, *topk_stable(_without_own_rows(sims, own), k)  # new tensors: the buffer is free again

    with full_float32_products(), _single_threaded_pool(workers) as pool:
        pending: deque = deque()
        for i, start in enumerate(range(0, len(query), block)):
            if len(pending) == workers:  # block i - workers, in the buffer block i takes, is done with first
                yield pending.popleft().result()
            pending.append(pool.submit(knn_block, start, buffers[i % workers]))
        while pending:
            yield pending.popleft().result()


def iter_knn(query: torch.Tensor, gallery: torch.Tensor, k: int, self_index: torch.Tensor | None = None,
             memory_mb: float = 256.0, engine: str = "torch") -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """Yield ``(first query row, similarities (b, k), gallery indices (b, k))`` block by block.

    ``query`` and ``gallery`` are l2-normalised (n, D) float32 CPU tensors; ``self_index[i]`` is the gallery
    row of query i (or -1), which is excluded from its neighbours. The results are CPU tensors whatever the
    engine.
    """
    engine = resolve_engine(engine)
    if engine == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
        block = block_rows_for(gallery.shape[0], CUDA_BLOCK_SCALE * memory_mb)
        yield from _queued_blocks(query, gallery, k, self_index, block, device)
        return
    block = block_rows_for(gallery.shape[0], memory_mb)

    def own_rows(start: int) -> torch.Tensor | None:
        return None if self_index is None else self_index[start:start + block]

    if engine == "faiss":
        searcher = _FaissSearcher(gallery)
        for start in range(0, query.shape[0], block):
            yield start, *searcher.block(query[start:start + block], k, own_rows(start))
        return
    workers = knn_workers()
    if engine == "torch" and workers > 1 and query.shape[0] > block_rows_for(gallery.shape[0], memory_mb / workers):
        block = block_rows_for(gallery.shape[0], memory_mb / workers)
        yield from _blocks_in_parallel(query, gallery, k, self_index, block, workers)
        return
    for start, sims in similarity_blocks(query, gallery, block, engine):  # the top-k's tensors are new: none is sims
        yield start, *topk_stable(_without_own_rows(sims, own_rows(start)), k)


def knn(query: torch.Tensor, gallery: torch.Tensor, k: int, self_index: torch.Tensor | None = None,
        memory_mb: float = 256.0, engine: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
    """All neighbours at once: similarities and indices, each (n_query, k)."""
    parts = list(iter_knn(query, gallery, k, self_index, memory_mb, engine))
    return torch.cat([p[1] for p in parts]), torch.cat([p[2] for p in parts])
