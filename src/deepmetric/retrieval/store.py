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

What ``index.json`` holds, how its paths are stored and found again, and how each key is checked: ``manifest.py``.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file as load_safetensors_file
from safetensors.numpy import save as save_safetensors

from ..errors import IndexStoreError
from ..folders import INDEX_MANIFEST, check_index_dir
from ..io.files import atomic_write_bytes, atomic_write_text, fsync_dir, open_in_place, temporary_folder
from ..io.strict import MalformedFile, load_json
from . import faiss_index
from .manifest import FORMAT, IndexManifest, manifest_from_dict, resolved

MANIFEST = INDEX_MANIFEST


def read_manifest(index_dir: str | Path, model: bool = False) -> IndexManifest:
    """``INDEX_DIR/index.json``, every key checked; ``model``: the whole model record that embeds images too (a
    search by image, ``index --add``), else only the keys it holds (a search by vectors needs none)."""
    check_index_dir(index_dir)
    path = Path(index_dir) / MANIFEST
    try:
        data = load_json(path.read_bytes())
    except MalformedFile as error:
        raise IndexStoreError(f"{path} is not a valid manifest: {error}") from None
    except OSError as error:
        raise IndexStoreError(f"{path} cannot be read: {error.strerror or error}") from None
    return manifest_from_dict(data, path, model)


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
    _check_ids(path, index, manifest)  # first: reconstruct_n on an IVF file aborts the process inside faiss
    vectors = np.asarray(index.reconstruct_n(0, index.ntotal)) if manifest.kind == "flat" and index.ntotal else None
    if vectors is not None and not np.isfinite(vectors).all():
        raise IndexStoreError(f"{path} holds NaN or infinite vectors; the index is damaged: rebuild it")
    return index


def _check_ids(path: Path, index: Any, manifest: IndexManifest) -> None:
    """Refuse a faiss file whose searches could answer an id that is no item: a flat index must be one (its ids are its
    rows), an IVF-PQ index must store each item's id once (one beyond the count crashed ``search`` with an
    IndexError and made ``serve`` answer 500)."""
    ids = faiss_index.stored_ids(index)
    if manifest.kind == "flat":
        if ids is not None or not faiss_index.is_flat(index):
            raise IndexStoreError(f"{path} is not the flat index the manifest says; the index is damaged: rebuild it")
        return
    if ids is None:
        raise IndexStoreError(f"{path} is not the IVF-PQ index the manifest says; the index is damaged: rebuild it")
    outside = ids[(ids < 0) | (ids >= manifest.count)]
    if len(outside):
        raise IndexStoreError(f"{path} holds {len(outside)} item id(s) outside 0 to {manifest.count - 1} (e.g. "
                              f"{int(outside[0])}); the index is damaged: rebuild it")
    if len(np.unique(ids)) != manifest.count:
        raise IndexStoreError(f"{path} does not hold each of its {manifest.count} items once; the index is damaged: "
                              "rebuild it")


def _write_generation(folder: Path, manifest: IndexManifest, embeddings: np.ndarray, index: Any, home: Path) -> None:
    """Write the generation's data files, then the manifest that points at them (the commit point), its paths as
    stored for the index folder ``home``."""
    data = save_safetensors({"embeddings": np.ascontiguousarray(embeddings, dtype=np.float32)},
                            metadata={"format": FORMAT})
    atomic_write_bytes(folder / manifest.embeddings_file, data)
    atomic_write_bytes(folder / manifest.faiss_file, faiss_index.serialize(index))
    manifest.origin = str(home)
    atomic_write_text(folder / MANIFEST, json.dumps(manifest.to_dict(home), indent=1))


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
        _write_generation(tmp, manifest, embeddings, index, resolved(out.parent) / out.name)
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
    (``deepmetric.io.files.open_in_place``: a link there is refused, naming it)."""
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
                    new_items: list[dict[str, Any]], sources: list[str],
                    model: dict[str, Any] | None = None) -> IndexManifest:
    """Append ``new_items`` (ids assigned here) and their embeddings to the index ``manifest`` was read from; its
    paths are written again for where the index lies now, ``model`` (the same model's record, where its run is now)
    replacing the stored one when given.

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
    updated = IndexManifest(kind=manifest.kind, model=model or manifest.model, embedding_dim=manifest.embedding_dim,
                            items=items, sources=sources, generation=manifest.generation + 1,
                            ivf_pq=manifest.ivf_pq, created_at=manifest.created_at,
                            updated_at=time.strftime("%Y-%m-%d %H:%M:%S"))
    _write_generation(folder, updated, np.concatenate([old, embeddings.astype(np.float32)]), index,
                      resolved(folder))
    for stale in (manifest.embeddings_file, manifest.faiss_file):
        (folder / stale).unlink(missing_ok=True)
    return updated
