"""The retrieval index on disk: JSON metadata, safetensors embeddings and a faiss index, never half-written.

```
INDEX_DIR/
  index.json                      the manifest: format, generation, kind, model, dim, count, sources, items
  embeddings-<gen>.safetensors    (N, D) float32 l2-normalised embeddings, row i = item id i
  faiss-<gen>.index               faiss' binary serialisation of the search index (flat or IVF-PQ)
  .lock                           held while an --add rewrites the index
```

A new index is written into a temporary folder beside ``INDEX_DIR`` and renamed onto it. Appending writes
the next generation's embeddings and faiss files, then replaces ``index.json`` atomically (the commit
point), then removes the older generation: a reader or a crash at any moment sees one whole generation.
Nothing is pickled: the formats are JSON, safetensors and faiss' own flat binary format.

Item ``i`` is the image of row ``i``: ``{"id": i, "source": s, "path": p}`` where ``p`` is relative to
``sources[s]`` (an absolute folder) unless the image lies outside it; ``path`` is null for an index built
from vectors alone (the benchmark's synthetic index).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file as load_safetensors_file
from safetensors.numpy import save as save_safetensors

from ..errors import IndexStoreError
from ..io import atomic_write_bytes, atomic_write_text, fsync_dir, open_in_place, temporary_folder
from . import faiss_index

FORMAT = "deepmetric-index-1"
MANIFEST = "index.json"


@dataclass
class IndexManifest:
    """What ``index.json`` holds (see the module docstring)."""

    kind: str
    model: dict[str, Any]
    embedding_dim: int
    items: list[dict[str, Any]]
    sources: list[str] = field(default_factory=list)
    generation: int = 1
    ivf_pq: dict[str, int] | None = None
    created_at: str = ""
    updated_at: str = ""

    @property
    def count(self) -> int:
        return len(self.items)

    @property
    def embeddings_file(self) -> str:
        return f"embeddings-{self.generation}.safetensors"

    @property
    def faiss_file(self) -> str:
        return f"faiss-{self.generation}.index"

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "generation": self.generation, "kind": self.kind, "model": self.model,
                "embedding_dim": self.embedding_dim, "count": self.count, "ivf_pq": self.ivf_pq,
                "embeddings_file": self.embeddings_file, "faiss_file": self.faiss_file,
                "created_at": self.created_at, "updated_at": self.updated_at, "sources": self.sources,
                "items": self.items}

    def image_path(self, item_id: int) -> Path | None:
        """The file of item ``item_id`` (None when the index holds no file for it)."""
        item = self.items[item_id]
        if item.get("path") is None:
            return None
        return Path(self.sources[item["source"]]) / item["path"]

    def name(self, item_id: int) -> str:
        """What to show for an item: its path as stored (relative to its source), or ``#id``."""
        path = self.items[item_id].get("path")
        return str(path) if path is not None else f"#{item_id}"


def _manifest_from_dict(data: dict[str, Any], where: Path) -> IndexManifest:
    if data.get("format") != FORMAT:
        raise IndexStoreError(f"{where} is not a deepmetric index (format {data.get('format')!r}, expected {FORMAT})")
    try:
        manifest = IndexManifest(kind=data["kind"], model=data["model"], embedding_dim=int(data["embedding_dim"]),
                                 items=data["items"], sources=data.get("sources", []),
                                 generation=int(data["generation"]), ivf_pq=data.get("ivf_pq"),
                                 created_at=data.get("created_at", ""), updated_at=data.get("updated_at", ""))
    except (KeyError, TypeError, ValueError) as error:
        raise IndexStoreError(f"{where} is a damaged index manifest ({error!r})") from None
    if manifest.count != int(data.get("count", -1)):
        raise IndexStoreError(f"{where} lists {manifest.count} items but says count {data.get('count')}")
    problem = _manifest_problem(manifest)
    if problem:
        raise IndexStoreError(f"{where} is a damaged index manifest: {problem}")
    return manifest


def check_model_record(manifest: IndexManifest, where: Path) -> None:
    """The model record that embeds queries (``Searcher``; an index searched by vectors alone needs none)."""
    from ..data.resizing import TEST_RESIZE_MODES

    model = manifest.model
    problem = None
    if not _is_int(model.get("image_size"), 8, 8192):
        problem = f"model.image_size {model.get('image_size')!r} is not an integer from 8 to 8192"
    elif model.get("test_resize") not in TEST_RESIZE_MODES:
        problem = f"model.test_resize {model.get('test_resize')!r} is not one of {', '.join(TEST_RESIZE_MODES)}"
    elif not isinstance(model.get("checkpoint"), str) or not isinstance(model.get("checkpoint_sha256"), str):
        problem = "model.checkpoint and model.checkpoint_sha256 must be strings"
    if problem:
        raise IndexStoreError(f"{where} is a damaged index manifest: {problem}")


def _is_int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _manifest_problem(manifest: IndexManifest) -> str | None:
    """What is wrong with a manifest's values (a hand-edited ``index.json``), or None: everything that the search
    reads from it is checked here, so that a bad value is one error rather than a traceback later."""
    if manifest.kind not in faiss_index.KINDS:
        return f"kind {manifest.kind!r} is not one of {', '.join(faiss_index.KINDS)}"
    if not _is_int(manifest.embedding_dim, 1, 1 << 20):
        return f"embedding_dim {manifest.embedding_dim!r} is not a positive integer"
    if not isinstance(manifest.model, dict) or not isinstance(manifest.model.get("spec"), dict):
        return "its 'model' entry is not the record deepmetric writes"
    if manifest.ivf_pq is not None:
        params = manifest.ivf_pq
        if not isinstance(params, dict) or not all(_is_int(params.get(k), 1, 1 << 24) for k in ("nlist", "m", "nbits",
                                                                                                 "nprobe")):
            return f"ivf_pq {params!r} must give positive integers nlist, m, nbits and nprobe"
        if params["nprobe"] > params["nlist"]:
            return f"ivf_pq.nprobe {params['nprobe']} is larger than nlist {params['nlist']}"
    if not isinstance(manifest.items, list) or not all(isinstance(item, dict) for item in manifest.items):
        return "its 'items' entry is not a list of records"
    return None


def read_manifest(index_dir: str | Path) -> IndexManifest:
    """``INDEX_DIR/index.json``, checked."""
    path = Path(index_dir) / MANIFEST
    if not path.is_file():
        what = "does not exist" if not Path(index_dir).exists() else f"holds no {MANIFEST}"
        raise IndexStoreError(f"{index_dir} is not a deepmetric index: it {what} (build one with deepmetric index)")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise IndexStoreError(f"{path} is not valid JSON: {error}") from None
    return _manifest_from_dict(data, path)


def read_embeddings(index_dir: str | Path, manifest: IndexManifest) -> np.ndarray:
    """The (N, D) float32 embeddings of ``manifest``'s generation."""
    path = Path(index_dir) / manifest.embeddings_file
    try:
        x = load_safetensors_file(path)["embeddings"]
    except FileNotFoundError:
        raise IndexStoreError(f"{path} is missing (the index folder is incomplete)") from None
    except (SafetensorError, KeyError) as error:
        raise IndexStoreError(f"{path} is not a readable embeddings file: {error}") from None
    if x.shape != (manifest.count, manifest.embedding_dim):
        raise IndexStoreError(f"{path} holds {x.shape} embeddings, the manifest says "
                              f"({manifest.count}, {manifest.embedding_dim})")
    if not np.isfinite(x).all():
        raise IndexStoreError(f"{path} holds NaN or infinite embeddings ({int((~np.isfinite(x)).any(1).sum()):,} "
                              "rows); the index is damaged: rebuild it")
    return x


def read_faiss(index_dir: str | Path, manifest: IndexManifest) -> Any:
    """The faiss index of ``manifest``'s generation, checked against it."""
    path = Path(index_dir) / manifest.faiss_file
    if not path.is_file():
        raise IndexStoreError(f"{path} is missing (the index folder is incomplete)")
    nprobe = manifest.ivf_pq["nprobe"] if manifest.ivf_pq else None
    index = faiss_index.deserialize(path.read_bytes(), nprobe)
    if index.ntotal != manifest.count or index.d != manifest.embedding_dim:
        raise IndexStoreError(f"{path} holds {index.ntotal} vectors of {index.d} dimensions, the manifest says "
                              f"{manifest.count} of {manifest.embedding_dim}")
    vectors = np.asarray(index.reconstruct_n(0, index.ntotal)) if manifest.kind == "flat" and index.ntotal else None
    if vectors is not None and not np.isfinite(vectors).all():
        raise IndexStoreError(f"{path} holds NaN or infinite vectors; the index is damaged: rebuild it")
    return index


def _write_generation(folder: Path, manifest: IndexManifest, embeddings: np.ndarray, index: Any) -> None:
    """Write the generation's data files, then the manifest that points at them (the commit point)."""
    data = save_safetensors({"embeddings": np.ascontiguousarray(embeddings, dtype=np.float32)},
                            metadata={"format": FORMAT})
    atomic_write_bytes(folder / manifest.embeddings_file, data)
    atomic_write_bytes(folder / manifest.faiss_file, faiss_index.serialize(index))
    atomic_write_text(folder / MANIFEST, json.dumps(manifest.to_dict(), indent=1))


def _check_vectors(embeddings: np.ndarray, items: list[dict[str, Any]], dim: int) -> None:
    if embeddings.ndim != 2 or embeddings.shape[1] != dim or len(embeddings) != len(items):
        raise IndexStoreError(f"{len(items)} items need ({len(items)}, {dim}) embeddings, got {embeddings.shape}")


def create_index(index_dir: str | Path, manifest: IndexManifest, embeddings: np.ndarray, index: Any) -> Path:
    """Write a new index at ``index_dir`` (which must not hold one) through a temporary folder and a rename."""
    out = Path(index_dir)
    _check_vectors(embeddings, manifest.items, manifest.embedding_dim)
    if (out / MANIFEST).exists():
        raise IndexStoreError(f"{out} already holds an index; add images to it with --add, or choose another --out")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise IndexStoreError(f"{out} exists and is not an empty folder; choose another --out")
    manifest.created_at = manifest.updated_at = time.strftime("%Y-%m-%d %H:%M:%S")
    tmp = temporary_folder(out)
    try:
        _write_generation(tmp, manifest, embeddings, index)
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(out.parent)
    return out


@contextmanager
def locked(index_dir: str | Path) -> Iterator[None]:
    """Hold ``INDEX_DIR/.lock`` exclusively (one writer at a time); it is opened without following a symbolic link
    (``deepmetric.io.open_in_place``: a link there is refused, naming it)."""
    fd = open_in_place(Path(index_dir) / ".lock", os.O_WRONLY | os.O_CREAT | os.O_APPEND, IndexStoreError)
    with os.fdopen(fd, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise IndexStoreError(f"{index_dir} is being updated by another process; try again when it is done") \
                from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def append_to_index(index_dir: str | Path, manifest: IndexManifest, embeddings: np.ndarray,
                    new_items: list[dict[str, Any]], sources: list[str]) -> IndexManifest:
    """Append ``new_items`` (ids assigned here) and their embeddings to the index ``manifest`` was read from.

    The caller holds ``locked(index_dir)`` and has checked that the embeddings come from the index's model.
    Returns the new generation's manifest.
    """
    folder = Path(index_dir)
    _check_vectors(embeddings, new_items, manifest.embedding_dim)
    old = read_embeddings(folder, manifest)
    index = read_faiss(folder, manifest)
    index.add(np.ascontiguousarray(embeddings, dtype=np.float32))
    items = list(manifest.items)
    for offset, item in enumerate(new_items):
        items.append({**item, "id": manifest.count + offset})
    updated = IndexManifest(kind=manifest.kind, model=manifest.model, embedding_dim=manifest.embedding_dim,
                            items=items, sources=sources, generation=manifest.generation + 1,
                            ivf_pq=manifest.ivf_pq, created_at=manifest.created_at,
                            updated_at=time.strftime("%Y-%m-%d %H:%M:%S"))
    _write_generation(folder, updated, np.concatenate([old, embeddings.astype(np.float32)]), index)
    for stale in (manifest.embeddings_file, manifest.faiss_file):
        (folder / stale).unlink(missing_ok=True)
    return updated
