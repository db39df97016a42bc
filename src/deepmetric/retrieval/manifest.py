"""The retrieval index's manifest, ``index.json``: what it holds (``IndexManifest``), how its paths are stored and found
again after a move (``stored_path``, ``located_path``), and every key checked for its presence and type
(``manifest_from_dict``); ``store.read_manifest`` reads it from an index folder.

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

``manifest_from_dict`` (through ``store.read_manifest``) checks every key for its presence and type before anything
uses it (a hand-edited ``index.json``): a bad one is one ``IndexStoreError`` naming the file, the key and what it
expects.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..data.resizing import TEST_RESIZE_MODES
from ..errors import IndexStoreError
from . import faiss_index

FORMAT = "deepmetric-index-1"


@dataclass
class IndexManifest:
    """What ``index.json`` holds (see the module docstring; the folder around it: ``store``), its paths absolute."""

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


def resolved(path: Path) -> Path:
    """``path`` absolute, its links resolved where they can be."""
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
    here = resolved(folder / path)
    if origin is not None and not _exists(here):
        there = resolved(Path(origin) / path)
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


def manifest_from_dict(data: Any, where: Path, full_model: bool) -> IndexManifest:
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
