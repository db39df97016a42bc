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

Item ``i`` is the image of row ``i``: ``{"id": i, "source": s, "path": p}`` where ``p`` is relative to the
gallery folder ``sources[s]``, without ``..`` (indexes written before this rule may hold an absolute ``p``: it is read
only when it lies inside ``sources[s]``, and taken as relative to it; an item outside every folder the index was built
from is refused, so that a hand-edited ``index.json`` cannot make ``serve`` publish another file of the server's);
``path`` is null for an
index built from vectors alone (the benchmark's synthetic index) or from images in memory (``deepmetric.Index``). An
item may also hold ``"name"``, what a search shows for it instead of its path (names given in Python).

Paths and moves: ``model.run_dir``, ``model.checkpoint`` and ``sources`` are written relative to the index folder
(``../gallery``) when they share a folder with it below the file system's root, else absolute; ``origin`` is the
absolute folder the index was written in. A relative path is looked up from where the index folder is now, then
from ``origin``: an index moved together with its galleries and run (or with them copied beside it as they were)
finds them where it lies, and an index moved alone finds them where they stayed. Indexes written with absolute paths
(no ``origin``) load as before. In memory (``IndexManifest``) every path is absolute, as found.

``read_manifest`` checks every key for its presence and type before anything uses it (a hand-edited
``index.json``): a bad one is one ``IndexStoreError`` naming the file, the key and what it expects.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
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

from ..data.resizing import TEST_RESIZE_MODES
from ..errors import IndexStoreError
from ..folders import INDEX_MANIFEST, check_index_dir
from ..io import (
    MalformedFile,
    atomic_write_bytes,
    atomic_write_text,
    fsync_dir,
    load_json,
    open_in_place,
    temporary_folder,
)
from . import faiss_index

FORMAT = "deepmetric-index-1"
MANIFEST = INDEX_MANIFEST


@dataclass
class IndexManifest:
    """What ``index.json`` holds (see the module docstring), its paths absolute."""

    kind: str
    model: dict[str, Any]
    embedding_dim: int
    items: list[dict[str, Any]]
    sources: list[str] = field(default_factory=list)
    generation: int = 1
    ivf_pq: dict[str, int] | None = None
    created_at: str = ""
    updated_at: str = ""
    origin: str | None = None
    """The absolute folder the index was last written in (None for indexes written before it was kept)."""

    @property
    def count(self) -> int:
        return len(self.items)

    @property
    def embeddings_file(self) -> str:
        return f"embeddings-{self.generation}.safetensors"

    @property
    def faiss_file(self) -> str:
        return f"faiss-{self.generation}.index"

    def to_dict(self, home: Path) -> dict[str, Any]:
        """The JSON of an index whose folder is ``home`` (absolute, links resolved): its paths as stored there."""
        model = dict(self.model)
        for key in MODEL_PATHS:
            if isinstance(model.get(key), str):
                model[key] = stored_path(model[key], home)
        return {"format": FORMAT, "generation": self.generation, "kind": self.kind, "model": model,
                "embedding_dim": self.embedding_dim, "count": self.count, "ivf_pq": self.ivf_pq,
                "embeddings_file": self.embeddings_file, "faiss_file": self.faiss_file,
                "created_at": self.created_at, "updated_at": self.updated_at, "origin": str(home),
                "sources": [stored_path(source, home) for source in self.sources], "items": self.items}

    def image_path(self, item_id: int) -> Path | None:
        """The file of item ``item_id`` (None when the index holds no file for it), always inside its gallery folder:
        a path changed in memory to leave it (absolute, or through ``..``) raises ``IndexStoreError``."""
        item = self.items[item_id]
        path = item.get("path")
        if path is None:
            return None
        if not _is_relative_item_path(path):
            raise IndexStoreError(f"item {item_id}'s path is not inside its gallery folder")
        return Path(self.sources[item["source"]]) / path

    def name(self, item_id: int) -> str:
        """What to show for an item: the name it was given (``deepmetric.Index``), else its path relative to its
        gallery folder, or ``#id`` without a file. Never an absolute path (an item stored absolute in an index written
        before items were always relative is held relative to its folder once read; one made absolute in memory shows
        its file name)."""
        item = self.items[item_id]
        if isinstance(item.get("name"), str):
            return item["name"]
        path = item.get("path")
        if path is None:
            return f"#{item_id}"
        return Path(path).name if os.path.isabs(path) else str(path)


MODEL_PATHS = ("run_dir", "checkpoint")
SHA256 = re.compile(r"[0-9a-f]{64}")
REQUIRED = object()


def stored_path(path: str, home: Path) -> str:
    """``path`` as ``index.json`` keeps it for the index folder ``home``: relative (POSIX) when the two share a folder
    below the file system's root, else as it is."""
    target = Path(path)
    if not target.is_absolute() or not home.is_absolute():
        return path
    if os.path.commonpath([target, home]) == target.anchor:
        return path
    return Path(os.path.relpath(target, home)).as_posix()


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # a loop of links: what it says is what there is
        return Path(os.path.abspath(path))


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name too long, a permission: not found here
        return False


def located_path(stored: str, folder: Path, origin: str | None) -> str:
    """The absolute path of a path ``stored`` in the index at ``folder``: an absolute one as it is; a relative one
    from ``folder`` when something is there, else from ``origin`` (where the index was written) when something is
    there, else from ``folder``."""
    path = Path(stored)
    if path.is_absolute():
        return stored
    here = _resolved(folder / path)
    if origin is not None and not _exists(here):
        there = _resolved(Path(origin) / path)
        if _exists(there):
            return str(there)
    return str(here)


class ManifestProblem(Exception):
    """A key of ``index.json`` that is missing or has a value of the wrong type (its message names both)."""


def _shown(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind_of(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def _value(record: dict[str, Any], key: str, label: str, ok: Any, expected: str, default: Any = REQUIRED) -> Any:
    if key not in record:
        if default is REQUIRED:
            raise ManifestProblem(f"{label} is missing (expected {expected})")
        return default
    value = record[key]
    if not ok(value):
        raise ManifestProblem(f"{label} is {_shown(value)} (expected {expected})")
    return value


def _is_int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _is_path(value: Any) -> bool:
    return isinstance(value, str) and value != "" and "\x00" not in value


def _is_relative_item_path(value: Any) -> bool:
    return _is_path(value) and not os.path.isabs(value) and ".." not in Path(value).parts


def _is_item_path(value: Any) -> bool:
    """Null, a path relative to its gallery folder without ``..``, or (an index written before that rule) absolute."""
    return value is None or _is_relative_item_path(value) or (_is_path(value) and os.path.isabs(value))


def _below(path: str, folder: str) -> str | None:
    """``path`` (absolute) relative to ``folder`` (absolute) as a POSIX path when it lies strictly below it, compared
    by name after normalising (``a/./b``, ``a/x/../b``); None when it does not."""
    path, folder = os.path.normpath(path), os.path.normpath(folder)
    if path == folder or os.path.commonpath([path, folder]) != folder:
        return None
    return Path(os.path.relpath(path, folder)).as_posix()


MODEL_FIELDS: tuple[tuple[str, Any, str, Any], ...] = (
    ("spec", lambda v: isinstance(v, dict), "an object (the model's spec)", REQUIRED),
    ("run_dir", _is_path, "a path (a non-empty string)", REQUIRED),
    ("checkpoint", _is_path, "a path (a non-empty string)", REQUIRED),
    ("checkpoint_sha256", lambda v: isinstance(v, str) and SHA256.fullmatch(v) is not None,
     "the checkpoint's SHA-256, 64 lowercase hexadecimal digits", REQUIRED),
    ("step", lambda v: v is None or _is_int(v, 0, 1 << 62), "null or a step number", None),
    ("image_size", lambda v: _is_int(v, 8, 8192), "an integer from 8 to 8192", REQUIRED),
    ("test_resize", lambda v: v in TEST_RESIZE_MODES, f"one of {', '.join(TEST_RESIZE_MODES)}", REQUIRED),
)
"""The model record that embeds queries: key, check, what it expects, default (``REQUIRED``: none)."""

IVF_PQ_KEYS = ("nlist", "m", "nbits", "nprobe")


def _model_record(data: dict[str, Any], folder: Path, origin: str | None, full: bool) -> dict[str, Any]:
    """``data['model']`` checked (``full``: every key that embedding a query needs, else only the spec and the keys
    present), its paths located."""
    model = _value(data, "model", "model", lambda v: isinstance(v, dict), "an object (the model record)")
    checked = dict(model)
    for key, ok, expected, default in MODEL_FIELDS:
        if full or key in model or key == "spec":
            value = _value(model, key, f"model.{key}", ok, expected, default)
            if key in model:
                checked[key] = located_path(value, folder, origin) if key in MODEL_PATHS else value
    return checked


def _items(data: dict[str, Any], sources: list[str]) -> list[dict[str, Any]]:
    """``data['items']`` checked against ``sources`` (the gallery folders, located: absolute); an item stored with an
    absolute path (an index written before paths were relative) is kept only when it lies inside its source, and
    then held relative to it."""
    items = _value(data, "items", "items", lambda v: isinstance(v, list), "a list of item records")
    last = f"an integer from 0 to {len(sources) - 1} (an entry of sources)" if sources else "0 (sources is empty)"
    for position, item in enumerate(items):
        label = f"items[{position}]"
        if not isinstance(item, dict):
            raise ManifestProblem(f"{label} is {_shown(item)} (expected an object with id, source and path)")
        _value(item, "id", f"{label}.id", lambda v, p=position: _is_int(v, p, p), f"{position}, its position")
        path = _value(item, "path", f"{label}.path", _is_item_path,
                      "null or a path relative to its gallery folder, without '..'")
        if path is None:
            _value(item, "source", f"{label}.source", lambda v: _is_int(v, 0, 1 << 31), "an integer", 0)
        else:
            source = _value(item, "source", f"{label}.source", lambda v: _is_int(v, 0, len(sources) - 1), last)
            if os.path.isabs(path):
                relative = _below(path, sources[source])
                if relative is None:
                    raise ManifestProblem(
                        f"{label}.path {_shown(path)} lies outside its gallery folder sources[{source}] "
                        f"({_shown(sources[source])}); an index serves only files inside the folders it was built "
                        "from: rebuild it with deepmetric index")
                item["path"] = relative
        _value(item, "name", f"{label}.name", lambda v: isinstance(v, str) and v != "", "a non-empty string", None)
    return items


def _ivf_pq(data: dict[str, Any], kind: str) -> dict[str, int] | None:
    if kind != "ivf-pq":
        return _value(data, "ivf_pq", "ivf_pq", lambda v: v is None, f"null for a {kind} index", None)
    expected = "positive integers " + ", ".join(IVF_PQ_KEYS) + ", nprobe at most nlist, for kind ivf-pq"
    return _value(data, "ivf_pq", "ivf_pq", lambda v: isinstance(v, dict)
                  and all(_is_int(v.get(k), 1, 1 << 24) for k in IVF_PQ_KEYS) and v["nprobe"] <= v["nlist"],
                  expected)


def _manifest_from_dict(data: Any, where: Path, full_model: bool) -> IndexManifest:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else f"none: it holds {_kind_of(data)}"
        raise IndexStoreError(f"{where} is not a deepmetric index (format {_shown(found)}, expected {FORMAT})")
    folder = where.parent
    try:
        origin = _value(data, "origin", "origin", lambda v: v is None or (_is_path(v) and os.path.isabs(v)),
                        "null or the absolute folder the index was written in", None)
        generation = _value(data, "generation", "generation", lambda v: _is_int(v, 1, 1 << 62),
                            "a positive integer")
        kind = _value(data, "kind", "kind", lambda v: v in faiss_index.KINDS, f"one of {', '.join(faiss_index.KINDS)}")
        dim = _value(data, "embedding_dim", "embedding_dim", lambda v: _is_int(v, 1, 1 << 20), "a positive integer")
        sources = _value(data, "sources", "sources", lambda v: isinstance(v, list) and all(map(_is_path, v)),
                         "a list of folders (non-empty strings)", [])
        sources = [located_path(s, folder, origin) for s in sources]
        manifest = IndexManifest(
            kind=kind, model=_model_record(data, folder, origin, full_model), embedding_dim=dim,
            items=_items(data, sources), sources=sources,
            generation=generation, ivf_pq=_ivf_pq(data, kind), origin=origin,
            created_at=_value(data, "created_at", "created_at", lambda v: isinstance(v, str), "a string", ""),
            updated_at=_value(data, "updated_at", "updated_at", lambda v: isinstance(v, str), "a string", ""))
        for key in ("embeddings_file", "faiss_file"):
            name = getattr(manifest, key)
            _value(data, key, key, lambda v, n=name: v == n, f"{name!r}, the file of generation {generation}", None)
        count = _value(data, "count", "count", lambda v: _is_int(v, 0, 1 << 62), "the number of items")
    except ManifestProblem as problem:
        raise IndexStoreError(f"{where} is a damaged index manifest: {problem}") from None
    if manifest.count != count:
        raise IndexStoreError(f"{where} lists {manifest.count} items but says count {count}")
    return manifest


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
    return _manifest_from_dict(data, path, model)


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
        _write_generation(tmp, manifest, embeddings, index, _resolved(out.parent) / out.name)
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
                      _resolved(folder))
    for stale in (manifest.embeddings_file, manifest.faiss_file):
        (folder / stale).unlink(missing_ok=True)
    return updated
