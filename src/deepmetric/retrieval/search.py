"""Query a retrieval index: embed a query image with the index's model, return the nearest gallery images.

Scores are cosine similarities (embeddings are l2-normalised). A flat index's scores are exact; IVF-PQ
proposes ``max(8 k, k + 64)`` candidates from the probed cells, which are re-ranked with the exact stored
embeddings, so its scores are exact too and only its recall is approximate.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config import RunConfig
from ..data.images import read_image
from ..data.transforms import TestTransform
from ..errors import DeepMetricError, IndexStoreError
from ..evaluation.rerank import Rerank, reranked_search
from ..io.files import file_sha256
from ..models import Embedder
from ..progress import progress_bar
from ..runs.folder import RunDir
from ..runs.trained import TrainedRun, open_run
from .manifest import IndexManifest
from .store import read_embeddings, read_faiss, read_manifest


@dataclass
class Hit:
    """One result: the gallery item's id, its name (path relative to its gallery folder, never an absolute path)
    and cosine score."""

    id: int
    name: str
    score: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class IndexSearcher:
    """Nearest neighbours of vectors in an index (no model; see ``Searcher`` for images)."""

    def __init__(self, index_dir: str | Path, model: bool = False):
        self.index_dir: Path | None = Path(index_dir)  # None: a Python Index held in memory only
        self.manifest: IndexManifest = read_manifest(self.index_dir, model=model)
        self.index = read_faiss(self.index_dir, self.manifest)
        self.exact = read_embeddings(self.index_dir, self.manifest) if self.manifest.kind == "ivf-pq" else None

    @property
    def count(self) -> int:
        return self.manifest.count

    def gallery_embeddings(self) -> np.ndarray:
        """(N, D) float32: every item's l2-normalised embedding, row ``i`` of item ``i``."""
        if self.exact is not None:
            return self.exact
        if self.count == 0:
            return np.zeros((0, self.manifest.embedding_dim), dtype=np.float32)
        return np.asarray(self.index.reconstruct_n(0, self.count), dtype=np.float32)

    def search_vectors(self, queries: np.ndarray, k: int, rerank: Rerank | None = None) -> list[list[Hit]]:
        """The top ``k`` (at most the index size) hits of each l2-normalised query row, best first; with ``rerank``
        (``evaluation/rerank.py``), each query re-ranked alone against every item (exact, whatever the index kind),
        scored ``1 - d*`` (k-reciprocal) or by cosine to the expanded query (αQE/DBA)."""
        queries = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)
        k = min(check_k(k), max(1, self.count))
        if rerank is not None and self.count:
            scores, ids = reranked_search(torch.from_numpy(queries), torch.from_numpy(self.gallery_embeddings()), k,
                                          rerank)
        elif self.exact is None:
            scores, ids = self.index.search(queries, k)
        else:
            width = min(self.count, max(8 * k, k + 64))
            _, candidates = self.index.search(queries, width)
            scores, ids = self._rerank(queries, candidates, k)
        return [[Hit(int(i), self.manifest.name(int(i)), float(s)) for s, i in zip(row_s, row_i, strict=True) if i >= 0]
                for row_s, row_i in zip(scores, ids, strict=True)]

    def _rerank(self, queries: np.ndarray, candidates: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact scores of the candidates (-1 = none), best first, ties by smaller id."""
        assert self.exact is not None  # search_vectors re-ranks only with the exact vectors
        exact = np.einsum("qd,qwd->qw", queries, self.exact[np.maximum(candidates, 0)])
        exact[candidates < 0] = -np.inf
        order = np.lexsort((candidates, -exact), axis=1)[:, :k]
        scores = np.take_along_axis(exact, order, axis=1)
        ids = np.where(np.isfinite(scores), np.take_along_axis(candidates, order, axis=1), -1)
        return scores, ids


def check_k(k: Any) -> int:
    """``k``, the hits asked for per query, refused unless a whole number from 1 (``k=0`` gave one hit)."""
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise IndexStoreError(f"k must be a whole number of hits, 1 or more, not {k!r}")
    return int(k)


def index_checkpoint(index_dir: str | Path, model_info: dict[str, Any], verify: bool = True) -> Path:
    """The checkpoint file of an index's model record (``read_manifest(..., model=True).model``): it must exist and,
    with ``verify``, be the file the index was built with (its SHA-256), else queries would be embedded by another
    model."""
    checkpoint = Path(model_info["checkpoint"])
    if not checkpoint.is_file():
        raise IndexStoreError(f"the index's model checkpoint {checkpoint} is missing (moved or deleted run "
                              "directory? it is looked for where it lay relative to the index folder, then where "
                              "the index was written); restore the run or rebuild the index")
    if verify and file_sha256(checkpoint) != model_info["checkpoint_sha256"]:
        raise IndexStoreError(f"{checkpoint} has changed since {index_dir} was built (the run was trained "
                              "further?): queries would be embedded by another model; rebuild the index")
    return checkpoint


def index_run(index_dir: str | Path, model_info: dict[str, Any], device: str | torch.device | None,
              verify: bool = True) -> TrainedRun:
    """The run an index's model record names (``read_manifest(..., model=True).model``), its checkpoint checked
    (``index_checkpoint``), embedding at the size and resize its gallery was embedded at. The run's config gives the
    memory format (NCHW and NHWC convolutions differ in the last bits) and, with ``device`` None, the device; an index
    whose run folder kept only its checkpoint is read with the default config."""
    checkpoint = index_checkpoint(index_dir, model_info, verify)
    run_dir = RunDir(model_info["run_dir"])
    try:
        config = run_dir.config()
    except (DeepMetricError, OSError):
        config = RunConfig()
    return open_run(run_dir, config, checkpoint, device, int(model_info["image_size"]), model_info["test_resize"])


class Searcher(IndexSearcher):
    """An index with its model (a ``TrainedRun``, ``run``): search by image (array or file)."""

    def __init__(self, index_dir: str | Path, device: str | torch.device = "cpu", verify_checkpoint: bool = True,
                 amp: str | bool | None = None, compile: bool | None = None):
        super().__init__(index_dir, model=True)  # the model record checked, its paths found where the index is now
        self.run = index_run(Path(index_dir), self.manifest.model, device, verify_checkpoint)
        self.run.set_inference(amp, compile)  # (None keeps the run's eval.amp / eval.compile)
        self.transform = TestTransform(self.run.image_size, self.run.test_resize)

    @property
    def model(self) -> Embedder:
        return self.run.model

    @property
    def device(self) -> torch.device:
        return self.run.device

    @torch.no_grad()
    def embed(self, image: np.ndarray) -> np.ndarray:
        """(D,) l2-normalised embedding of one (H, W, 3) uint8 image."""
        batch = self.transform(image).unsqueeze(0).to(self.device)
        return self.run.forward(batch).embedding[0].float().cpu().numpy()

    def search_image(self, image: np.ndarray, k: int = 10) -> list[Hit]:
        return self.search_vectors(self.embed(image)[None], k)[0]

    def search_file(self, path: str | Path, k: int = 10) -> list[Hit]:
        return self.search_files([Path(path)], k)[0]

    def search_files(self, paths: list[Path], k: int = 10, progress: bool = False,
                     rerank: Rerank | None = None) -> list[list[Hit]]:
        """The hits of each query file, every query embedded (as ``search_file`` does) before any is searched, so
        that an unreadable file stops the search before anything is printed (``rerank``: as ``search_vectors``)."""
        files = progress_bar(paths, desc="embedding queries", unit="image", disable=not progress or len(paths) < 2)
        return self.search_vectors(np.stack([self.embed(read_image(path)) for path in files]), k, rerank)
