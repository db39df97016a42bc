"""The faiss side of a retrieval index: build (exact flat or IVF-PQ), choose IVF-PQ's sizes, (de)serialise.

Embeddings are l2-normalised, so inner product is cosine similarity and both kinds use
``METRIC_INNER_PRODUCT``:

- ``flat``: ``IndexFlatIP``, exact; the default, right up to a few hundred thousand images on a CPU.
- ``ivf-pq``: an inverted file of ``nlist`` k-means cells whose residuals are product-quantised into ``m``
  8-bit codes (``m`` bytes per image instead of ``4 D``). Defaults follow faiss' guidelines:
  ``nlist ~ 4 sqrt(N)`` but at most N / 39 (k-means wants 39 training points per centroid), ``m`` the
  largest divisor of D at most D / 8 (sub-vectors of 8 or more dimensions), ``nprobe = min(nlist, 32)``.
  It needs at least 1,000 images: each sub-quantiser has 256 centroids, and below that the exact index
  is faster anyway. faiss' warning that PQ would like 39 x 256 training points is silenced: with fewer the
  codebooks are only finer than needed (measured on 1,000 random 16-d vectors, 8-bit codes keep 90% of
  the true top 10 among 40 candidates where 4-bit codes keep 63%). Search re-ranks IVF-PQ's candidates
  with the exact stored embeddings (``search``).

faiss' own serialisation is a flat binary format (never pickle); it is stored as raw bytes.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import IndexStoreError

log = logging.getLogger("deepmetric")

KINDS = ("flat", "ivf-pq")
POINTS_PER_CENTROID = 39  # faiss' minimum training points per k-means centroid
PQ_BITS = 8
MIN_IVF_PQ_IMAGES = 1000


def faiss_module() -> Any:
    """Import faiss, or say how to install it."""
    try:
        import faiss
    except ImportError:
        raise IndexStoreError("retrieval indexes need faiss: pip install faiss-cpu (or 'deepmetric[serve]')") from None
    return faiss


@dataclass
class IvfPqParams:
    """Sizes of an IVF-PQ index (see the module docstring for the defaults)."""

    nlist: int
    m: int
    nbits: int
    nprobe: int

    def to_dict(self) -> dict[str, int]:
        return {"nlist": self.nlist, "m": self.m, "nbits": self.nbits, "nprobe": self.nprobe}


def ivf_pq_params(count: int, dim: int, nlist: int | None = None, m: int | None = None,
                  nprobe: int | None = None) -> IvfPqParams:
    """Default (or check the given) IVF-PQ sizes for ``count`` training vectors of ``dim`` dimensions."""
    if count < MIN_IVF_PQ_IMAGES:
        raise IndexStoreError(f"an IVF-PQ index needs at least {MIN_IVF_PQ_IMAGES:,} images to train its quantisers "
                              f"and this gallery has {count}; use the exact index (leave out --ivf-pq), which is "
                              "also the better choice for a gallery this small")
    most_cells = count // POINTS_PER_CENTROID
    if nlist is None:
        nlist = max(1, min(round(4 * math.sqrt(count)), most_cells))
    elif not 1 <= nlist <= most_cells:
        raise IndexStoreError(f"--nlist must be between 1 and {most_cells} for {count} images "
                              f"({POINTS_PER_CENTROID} training images per cell), got {nlist}")
    if m is None:
        m = max(d for d in range(1, max(1, dim // 8) + 1) if dim % d == 0)
    elif m < 1 or dim % m:
        raise IndexStoreError(f"--pq-m must divide the embedding dimension {dim}, got {m}")
    nprobe = min(nlist, 32) if nprobe is None else max(1, min(nprobe, nlist))
    return IvfPqParams(nlist=nlist, m=m, nbits=PQ_BITS, nprobe=nprobe)


def build_faiss(embeddings: np.ndarray, kind: str = "flat", params: IvfPqParams | None = None) -> Any:
    """A faiss index over ``embeddings`` ((N, D) float32, l2-normalised), trained when it is IVF-PQ."""
    faiss = faiss_module()
    x = np.ascontiguousarray(embeddings, dtype=np.float32)
    dim = x.shape[1]
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "ivf-pq":
        params = params or ivf_pq_params(len(x), dim)
        index = faiss.index_factory(dim, f"IVF{params.nlist},PQ{params.m}x{params.nbits}", faiss.METRIC_INNER_PRODUCT)
        ivf = faiss.downcast_index(faiss.extract_index_ivf(index))
        ivf.pq.cp.min_points_per_centroid = 1  # see above
        # polysemous training permutes the PQ codes so that Hamming distances filter candidates (polysemous_ht),
        # which an inner-product search never uses: it took 89-126 s of a 141-s build of 1,029 images
        ivf.do_polysemous_training = False
        log.info("training the IVF-PQ index on %d vectors (%d lists, %d sub-quantizers of %d bits)", len(x),
                 params.nlist, params.m, params.nbits)
        index.train(x)
        index.nprobe = params.nprobe
    else:
        raise IndexStoreError(f"index kind must be one of {', '.join(KINDS)}, got '{kind}'")
    index.add(x)
    return index


def serialize(index: Any) -> bytes:
    return faiss_module().serialize_index(index).tobytes()


def deserialize(data: bytes, nprobe: int | None = None) -> Any:
    """Read an index written by ``serialize``; IVF indexes get their search-time ``nprobe`` back."""
    faiss = faiss_module()
    try:
        index = faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))
    except RuntimeError as error:
        raise IndexStoreError(f"the faiss index file is unreadable: {str(error).splitlines()[0]}") from None
    if nprobe is not None:
        faiss.extract_index_ivf(index).nprobe = nprobe
    return index


def stored_ids(index: Any) -> np.ndarray | None:
    """The item ids an IVF index stores in its inverted lists (each search answers with these), all lists together;
    None for an index of another kind (a flat index's ids are its row numbers)."""
    faiss = faiss_module()
    try:
        ivf = faiss.extract_index_ivf(index)
    except RuntimeError:
        return None
    lists = ivf.invlists
    parts = [faiss.rev_swig_ptr(lists.get_ids(number), size).copy() for number in range(ivf.nlist)
             if (size := lists.list_size(number))]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def is_flat(index: Any) -> bool:
    """Whether ``index`` is a plain flat index (its ids are its row numbers), not one that maps them elsewhere."""
    faiss = faiss_module()
    return isinstance(faiss.downcast_index(index), faiss.IndexFlat)
