"""``deepmetric index``: embed a gallery with a trained run and write (or extend) a retrieval index."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config.validate import set_inference
from ..data.listing import (
    LIST_SUFFIXES,
    files_table,
    first_of_each,
    folder_holding,
    image_sources,
    list_images,
    same_file_key,
)
from ..devices import resolve_device
from ..errors import IndexStoreError
from ..evaluation import EmbedSettings, embed_table
from ..io.files import check_writable, file_sha256
from ..runs.checkpoint import checkpoint_state
from ..runs.folder import RunDir
from ..runs.model import load_run_model
from . import faiss_index
from .manifest import IndexManifest
from .store import append_to_index, create_index, locked, read_manifest


@dataclass
class IndexResult:
    """What ``index_images`` did: the index folder, images added, images skipped as already indexed, total, and
    images given more than once (indexed once)."""

    index_dir: Path
    added: int
    skipped: int
    count: int
    kind: str
    repeated: int = 0


def gallery_files(images: str | os.PathLike | Sequence[str | os.PathLike]) -> tuple[Path, list[Path]]:
    """``(root, files)``: a folder (every image below it), one image, or a text file listing one path a line
    (relative to the list's folder; blank lines and ``#`` comments ignored); or several of these, their files in
    the order given. ``root`` is the gallery folder, which holds every file: the folder, the image's folder, or the
    list's folder (the folder holding all its files when some lie outside it); for several, the folder holding all
    their files. Files are absolute, their folders' links resolved, so that an item's path below ``root`` is the
    name it was found by."""
    givens = image_sources(images)
    if len(givens) > 1:
        files = [file for given in givens for file in gallery_files(given)[1]]
        return folder_holding(files), files
    images = Path(givens[0])
    found = list_images(images)
    if images.is_dir():
        root = images.resolve()
        return root, [root / file.relative_to(images) for file in found]
    if images.suffix.lower() in LIST_SUFFIXES:  # a list (its files resolved by list_images)
        folder = images.parent.resolve()
        inside = all(file.is_relative_to(folder) for file in found)
        return (folder if inside else folder_holding(found)), found
    file = images.parent.resolve() / images.name
    return file.parent, [file]


def relative_item(file: Path, root: Path, source: int) -> dict[str, Any]:
    """An item for ``file``, which lies below ``root`` (``gallery_files``): its path relative to ``root``."""
    return {"source": source, "path": file.relative_to(root).as_posix()}


def model_record(run_dir: str | Path, checkpoint: Path, image_size: int, test_resize: str) -> dict[str, Any]:
    """What an index remembers of its model: where it is (absolute here; ``index.json`` keeps it relative to the
    index folder, ``manifest.stored_path``), what it is, and the checkpoint's digest."""
    state = checkpoint_state(checkpoint)
    return {"run_dir": str(Path(run_dir).resolve()), "checkpoint": str(checkpoint.resolve()),
            "checkpoint_sha256": file_sha256(checkpoint), "step": state.get("step"), "spec": state["model_spec"],
            "image_size": image_size, "test_resize": test_resize}


def describe(model: dict[str, Any]) -> str:
    spec = model["spec"]
    return (f"{Path(model['checkpoint']).name} of {model['run_dir']} ({spec.get('backbone')} + {spec.get('head')}, "
            f"{spec.get('embedding_dim')}-d, {model['image_size']} px)")


def check_same_model(manifest: IndexManifest, model: dict[str, Any], index_dir: Path) -> None:
    """Refuse to mix embeddings of two models in one index: the same checkpoint (by digest), spec, size and resize
    or nothing. The model's width is not compared with the config's ``embedding_dim``, which a head may round down
    (DeML: 512 over 9 learners gives 504): the same model gives the index's width by construction."""
    old = manifest.model
    same = (old.get("spec") == model["spec"] and old.get("image_size") == model["image_size"]
            and old.get("test_resize") == model["test_resize"]
            and old.get("checkpoint_sha256") == model["checkpoint_sha256"])
    if not same:
        raise IndexStoreError(f"{index_dir} holds {manifest.embedding_dim}-d embeddings of {describe(old)}, not of "
                              f"{describe(model)}: embeddings of different models are not comparable; build a "
                              "separate index for it")


def index_images(run_dir: str | Path, images: str | Path | Sequence[str | Path], out: str | Path, kind: str = "flat",
                 add: bool = False, nlist: int | None = None, pq_m: int | None = None, which: str = "auto",
                 batch_size: int | None = None, progress: bool = True, amp: str | bool | None = None,
                 compile: bool | None = None) -> IndexResult:
    """Embed the gallery ``images`` (one or several, as ``gallery_files`` takes them) with the run's model and write
    the index ``out`` (or append with ``add``). A file given twice (a folder and an image in it) is indexed once.
    ``amp`` and ``compile`` set the pass's ``eval.amp`` and ``eval.compile`` (None: the run's)."""
    out = Path(out)
    faiss_index.faiss_module()  # fail before embedding when faiss is missing
    config = RunDir(run_dir).config()
    set_inference(config, amp, compile)
    checkpoint = RunDir(run_dir).checkpoint(which)
    model_info = model_record(run_dir, checkpoint, config.data.image_size, config.data.test_resize)
    manifest = None
    if add:
        manifest = read_manifest(out, model=True)
        check_same_model(manifest, model_info, out)
    elif (out / "index.json").exists():
        raise IndexStoreError(f"{out} already holds an index; add images to it with --add, or choose another --out")
    check_writable(out.parent / f".{out.name}" if not add else out / "index.json")  # before the embedding work
    root, given = gallery_files(images)
    folders: dict[str, str] = {}
    files = first_of_each(given, folders)
    repeated, skipped = len(given) - len(files), 0
    if manifest is not None:
        known = {same_file_key(p, folders) for i in range(manifest.count) if (p := manifest.image_path(i)) is not None}
        fresh = [f for f in files if same_file_key(f, folders) not in known]
        skipped = len(files) - len(fresh)
        files = fresh
        if not files:
            return IndexResult(out, 0, skipped, manifest.count, manifest.kind, repeated)
    elif kind == "ivf-pq" and len(files) < faiss_index.MIN_IVF_PQ_IMAGES:
        faiss_index.ivf_pq_params(len(files), int(model_info["spec"]["embedding_dim"]))  # raises, naming the count
    device = resolve_device(config.train.device)
    model, _, _ = load_run_model(run_dir, which, device)
    table = files_table(str(root), files)
    embeddings = embed_table(model, table, EmbedSettings.from_config(config, device, progress, batch_size),
                             desc="indexing")
    if manifest is None:
        params = faiss_index.ivf_pq_params(len(files), embeddings.shape[1], nlist, pq_m) if kind == "ivf-pq" else None
        index = faiss_index.build_faiss(embeddings, kind, params)
        items = [{"id": i, **relative_item(f, root, 0)} for i, f in enumerate(files)]
        manifest = IndexManifest(kind=kind, model=model_info, embedding_dim=embeddings.shape[1], items=items,
                                 sources=[str(root)], ivf_pq=params.to_dict() if params else None)
        create_index(out, manifest, embeddings, index)
        return IndexResult(out, len(files), 0, manifest.count, kind, repeated)
    with locked(out):
        current = read_manifest(out, model=True)
        check_same_model(current, model_info, out)
        sources = list(current.sources)
        if str(root) not in sources:
            sources.append(str(root))
        source = sources.index(str(root))
        new_items = [relative_item(f, root, source) for f in files]
        updated = append_to_index(out, current, embeddings, new_items, sources, model_info)
    return IndexResult(out, len(files), skipped, updated.count, updated.kind, repeated)


def index_size_bytes(index_dir: str | Path) -> int:
    """Bytes on disk of the index's current files."""
    folder = Path(index_dir)
    manifest = read_manifest(folder)
    names = ("index.json", manifest.embeddings_file, manifest.faiss_file)
    return sum(os.path.getsize(folder / n) for n in names if (folder / n).exists())
