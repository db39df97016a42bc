"""``Index``: the retrieval index of ``deepmetric index`` in Python: build (from a run's embeddings of a gallery or
from given embeddings), open, add, search and save, over ``retrieval.store``'s folders and
``retrieval.search.IndexSearcher``'s search."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from ..data.image_inputs import ImageInput, image_items, is_vectors, unit_rows
from ..data.listing import folder_holding
from ..errors import DataError, IndexStoreError
from ..evaluation.rerank import Rerank, as_rerank
from ..io.files import check_writable
from ..retrieval import faiss_index
from ..retrieval.build import check_same_model, gallery_files, model_record, relative_item
from ..retrieval.manifest import IndexManifest
from ..retrieval.search import Hit, IndexSearcher, check_k, index_run
from ..retrieval.store import append_to_index, create_index, locked, read_manifest
from ..runs.trained import TrainedRun


class Index(IndexSearcher):
    """A retrieval index in Python, over the folder ``deepmetric index`` writes (``retrieval/store.py``): cosine
    search of l2-normalised embeddings (exact ``flat``, or ``ivf-pq`` re-ranked exactly, ``retrieval/search.py``).

    Make one with ``Index.build(run, images)`` (embed a gallery with a run), ``Index.from_embeddings(x)`` or
    ``Index.open(folder)`` (``Index.load`` alike); ``add`` more, ``search`` by images or embeddings, ``save``.
    An index lives in memory until ``save``: ``save(folder)`` writes a new index folder, ``save()`` appends what was
    added since to the folder it was opened from or saved to (as ``deepmetric index --add``).

    Items are named, in search results, by the name given to them, else by their path relative to their gallery
    folder (as ``deepmetric search`` names them), else ``#id``.

    Examples:
        >>> run = deepmetric.load_run("runs/cub")
        >>> index = deepmetric.Index.build(run, "gallery/", "gallery-index")   # as `deepmetric index`
        >>> index.add(["new/1.jpg", "new/2.jpg"]); index.save()
        >>> [(h.id, h.name, h.score) for h in index.search("query.jpg", k=3)[0]]
    """

    def __init__(self, manifest: IndexManifest, index: Any = None, embeddings: np.ndarray | None = None,
                 run: TrainedRun | None = None, path: Path | None = None, device: str | torch.device | None = None,
                 verify_checkpoint: bool = True):
        """Internal: use ``build``, ``from_embeddings`` or ``open`` (``Index("photos-index")``, a folder given here, is
        refused naming ``Index.open``; ``index`` is required, ``embeddings`` only for ``ivf-pq``'s exact re-ranking)."""
        if isinstance(manifest, str | os.PathLike):
            raise TypeError(f"Index({str(manifest)!r}) takes no folder; open one with deepmetric.Index.open("
                            f"{str(manifest)!r}), or make one with Index.build(run, images, folder)")
        if index is None:
            raise TypeError("Index() is made by Index.build(run, images, folder), Index.from_embeddings(x) or "
                            "Index.open(folder)")
        self.manifest = manifest
        self.index = index
        self.exact = embeddings if manifest.kind == "ivf-pq" else None
        self.index_dir = path
        self._run = run
        self._device = device
        self._verify = verify_checkpoint
        self._saved = manifest.count if path is not None else 0
        self._generation = manifest.generation

    # -- making one ---------------------------------------------------------------------------------------------

    @classmethod
    def _new(cls, embeddings: np.ndarray, records: list[dict[str, Any]], sources: list[str], run: TrainedRun | None,
             kind: str, nlist: int | None, pq_m: int | None) -> Index:
        x = np.ascontiguousarray(embeddings, dtype=np.float32)
        if kind not in faiss_index.KINDS:
            raise IndexStoreError(f"index kind must be one of {', '.join(faiss_index.KINDS)}, got '{kind}'")
        params = faiss_index.ivf_pq_params(len(x), x.shape[1], nlist, pq_m) if kind == "ivf-pq" else None
        model = model_record(run.path, run.checkpoint, run.image_size, run.test_resize) if run else {"spec": {}}
        manifest = IndexManifest(kind=kind, model=model, embedding_dim=int(x.shape[1]),
                                 items=[{"id": i, **r} for i, r in enumerate(records)], sources=sources,
                                 ivf_pq=params.to_dict() if params else None)
        return cls(manifest, faiss_index.build_faiss(x, kind, params), x, run=run)

    @classmethod
    def from_embeddings(cls, embeddings: np.ndarray | torch.Tensor, names: Sequence[str] | None = None,
                        run: TrainedRun | None = None, kind: str = "flat", nlist: int | None = None,
                        pq_m: int | None = None) -> Index:
        """An index of ``embeddings`` (N, D), l2-normalised here, item ``i`` named ``names[i]`` (default ``#i``).

        Give the ``run`` that computed them to search the index by image too, and so that ``deepmetric search``
        and ``serve`` can use the saved folder. ``kind``: ``flat`` (exact) or ``ivf-pq`` (at least 1,000 rows;
        ``nlist`` cells and ``pq_m`` sub-quantisers, default as ``deepmetric index --ivf-pq``).

        Examples:
            >>> index = deepmetric.Index.from_embeddings(np.random.randn(100, 16), names=[f"v{i}" for i in range(100)])
            >>> index.search(np.random.randn(16), k=5)[0][0].name
        """
        x = unit_rows(embeddings, run.embedding_dim if run else None, "the embeddings")
        records = _vector_records(len(x), names)
        return cls._new(x, records, [], run, kind, nlist, pq_m)

    @classmethod
    def build(cls, run: TrainedRun, images: str | os.PathLike[str] | ImageInput | Sequence[ImageInput],
              out: str | os.PathLike[str] | None = None, names: Sequence[str] | None = None, kind: str = "flat",
              nlist: int | None = None, pq_m: int | None = None, batch_size: int | None = None,
              progress: bool | None = None) -> Index:
        """Embed the gallery ``images`` with ``run`` and index them; with ``out``, save the index there (a new
        folder) as ``deepmetric index RUN --images IMAGES --out OUT`` would.

        Args:
            run: the trained run (``load_run``).
            images: a folder (every image below it), a ``.txt``/``.lst`` file listing one image path a line, or one
                image file, taken as ``deepmetric index --images`` takes them; or a list of images as
                ``TrainedRun.embed`` takes them (files are named by their path below their common folder, images
                in memory ``#id``).
            out: the index folder to write (it must not hold an index); None: keep it in memory (``save`` later).
            names: one name per image, shown in search results instead of its path.
            kind: ``flat`` or ``ivf-pq``, as ``from_embeddings``.
            nlist: as ``from_embeddings``.
            pq_m: as ``from_embeddings``.
            batch_size: images per forward pass, as ``TrainedRun.embed``.
            progress: a progress bar, as ``TrainedRun.embed``.

        Examples:
            >>> index = deepmetric.Index.build(deepmetric.load_run("runs/cub"), "gallery/", "gallery-index")
            >>> len(index), index.names[:2]
        """
        if out is not None:  # refused before the embedding work, as `deepmetric index`
            out = Path(out)
            if (out / "index.json").exists():
                raise IndexStoreError(f"{out} already holds an index; open it and add to it (Index.open), or choose "
                                      "another folder")
            check_writable(out.parent / f".{out.name}")
        items, records, root = _gallery(images)
        sources = [root] if root is not None else []
        x = run.embed(items, batch_size=batch_size, progress=progress)
        index = cls._new(x, _named(records, names), sources, run, kind, nlist, pq_m)
        if out is not None:
            index.save(out)
        return index

    @classmethod
    def open(cls, path: str | os.PathLike[str], run: TrainedRun | None = None,
             device: str | torch.device | None = None, verify_checkpoint: bool = True) -> Index:
        """The index in the folder ``path`` (written by ``deepmetric index`` or ``save``).

        A search by image loads the index's own model on first use (its run's checkpoint, checked to be the file
        the index was built with unless ``verify_checkpoint`` is False; on ``device``, as ``load_run`` takes it),
        with the index's image size and resize; or give the ``run``, which must be that model.

        Examples:
            >>> index = deepmetric.Index.open("gallery-index", device="cpu")
            >>> index.search("query.jpg", k=5)[0]       # what `deepmetric search gallery-index --image query.jpg`
        """
        folder = Path(path)
        searcher = IndexSearcher(folder)
        embeddings = searcher.exact if searcher.exact is not None else None
        index = cls(searcher.manifest, searcher.index, embeddings, path=folder, device=device,
                    verify_checkpoint=verify_checkpoint)
        if run is not None:
            if "checkpoint_sha256" in searcher.manifest.model:
                full = read_manifest(folder, model=True)
                check_same_model(full, model_record(run.path, run.checkpoint, run.image_size, run.test_resize),
                                 folder)
            elif searcher.manifest.embedding_dim != run.embedding_dim:
                raise IndexStoreError(f"{folder} holds {searcher.manifest.embedding_dim}-d embeddings; "
                                      f"{run.path} computes {run.embedding_dim}-d ones")
            index._run = run
        return index

    load = open

    # -- what it holds ------------------------------------------------------------------------------------------

    @property
    def path(self) -> Path | None:
        """The folder the index was opened from or last saved to (None: only in memory)."""
        return self.index_dir

    @property
    def kind(self) -> str:
        return self.manifest.kind

    @property
    def embedding_dim(self) -> int:
        return self.manifest.embedding_dim

    @property
    def names(self) -> list[str]:
        """Each item's name, by id (what search results name it)."""
        return [self.manifest.name(i) for i in range(self.count)]

    @property
    def embeddings(self) -> np.ndarray:
        """(N, D) float32 l2-normalised embeddings, row ``i`` of item ``i`` (a copy)."""
        if self.exact is not None:
            return self.exact.copy()
        if self.count == 0:
            return np.zeros((0, self.embedding_dim), dtype=np.float32)
        return np.asarray(self.index.reconstruct_n(0, self.count), dtype=np.float32)

    def image_path(self, item_id: int) -> Path | None:
        """The file of item ``item_id`` (None for an item without one)."""
        return self.manifest.image_path(item_id)

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        where = f"{str(self.index_dir)!r}" if self.index_dir is not None else "in memory"
        pending = self.count - self._saved if self.index_dir is not None else self.count
        return (f"Index({where}, {self.kind}, {self.count} item{'' if self.count == 1 else 's'} of "
                f"{self.embedding_dim}-d"
                + (f", {pending} unsaved" if pending else "") + ")")

    @property
    def _embeds_images(self) -> bool:
        """Whether this index can embed images (it has a run, or its model record names one)."""
        return self._run is not None or "checkpoint" in self.manifest.model

    @property
    def run(self) -> TrainedRun:
        """The model that embeds images for this index: the run it was built or opened with, else the one its
        model record names (loaded on first use)."""
        if self._run is None:
            self._run = self._own_run()
        return self._run

    def _own_run(self) -> TrainedRun:
        where = self.index_dir if self.index_dir is not None else "this index"
        if "checkpoint" not in self.manifest.model:
            raise IndexStoreError(f"{where} was built from embeddings without a run: search it with embeddings, or "
                                  "give the run that computed them (Index.open(path, run=...))")
        model = read_manifest(self.index_dir, model=True).model if self.index_dir is not None else self.manifest.model
        return index_run(where, model, self._device, self._verify)

    # -- changing, searching, saving ----------------------------------------------------------------------------

    def add(self, images: Any, names: Sequence[str] | None = None, batch_size: int | None = None,
            progress: bool | None = None) -> list[int]:
        """Add images (as ``build`` takes them, embedded by ``run``) or embeddings (a float (N, D) or (D,) array or
        tensor, l2-normalised here; a float (N, D) tensor only to an index without a run, as ``search`` says);
        returns their ids. Nothing is skipped (``deepmetric index --add`` skips files
        already indexed); ``save`` writes them.

        Examples:
            >>> ids = index.add(["new/1.jpg", "new/2.jpg"], names=["one", "two"]); index.save()
        """
        if is_vectors(images, "the images", self._embeds_images):
            x = unit_rows(images, self.embedding_dim, "the embeddings")
            records = _vector_records(len(x), names)
        else:
            items, records, root = _gallery(images)
            x = self.run.embed(items, batch_size=batch_size, progress=progress)
            records = _named(records, names)
            if root is not None:
                if root not in self.manifest.sources:
                    self.manifest.sources.append(root)
                source = self.manifest.sources.index(root)
                records = [{**r, "source": source} if r["path"] is not None else r for r in records]
        start = self.count
        self.index.add(x)
        if self.exact is not None:
            self.exact = np.concatenate([self.exact, x])
        self.manifest.items.extend({"id": start + i, **r} for i, r in enumerate(records))
        return list(range(start, self.count))

    def search(self, queries: Any, k: int = 10, batch_size: int | None = None,
               progress: bool | None = None, rerank: Rerank | str | None = None) -> list[list[Hit]]:
        """The ``k`` nearest items (at most the index size) of each query, best first: one list of ``Hit`` (``id``,
        ``name``, cosine ``score``) per query, also for a single query.

        Args:
            queries: embeddings, a float (N, D) or (D,) numpy array or (D,) tensor (l2-normalised here); or images as
                ``TrainedRun.embed`` takes them (a path, a PIL image, a uint8 array, or a list), embedded by
                ``run``: the same hits as ``deepmetric search INDEX --image FILE``. A float (N, D) tensor is
                embeddings for an index without a run; one with a run refuses it, as ``TrainedRun.embed`` takes it
                for one gray (H, W) image: give ``x.numpy()`` for embeddings, ``[x]`` for an image.
            k: how many hits per query.
            batch_size: images per forward pass, as ``TrainedRun.embed``.
            progress: a progress bar, as ``TrainedRun.embed``.
            rerank: re-rank each query alone against every item, as ``deepmetric search --rerank``:
                ``"k-reciprocal"``, ``"qe"``, ``"dba"``, ``"dba+qe"`` (their defaults) or settings
                (``deepmetric.evaluation.rerank.KReciprocal(k1=20, k2=6, lambda_value=0.3)``,
                ``QueryExpansion(qe_n=10, dba_n=0, alpha=3.0)``); the score is then ``1 - d*`` (k-reciprocal) or
                the cosine of the expanded query and the (augmented) item.

        Examples:
            >>> hits = index.search("query.jpg", k=5)[0]
            >>> [(h.name, round(h.score, 3)) for h in hits]
            >>> index.search("query.jpg", k=5, rerank="k-reciprocal")[0]
        """
        check_k(k)  # before any embedding work
        rerank = as_rerank(rerank)
        if is_vectors(queries, "the queries", self._embeds_images):
            x = unit_rows(queries, self.embedding_dim, "the queries")
        else:
            x = self.run.embed(queries, batch_size=batch_size, progress=progress)
        if len(x) == 0:
            return []
        return self.search_vectors(x, k, rerank)

    def save(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Write the index; returns its folder.

        ``save(folder)``: a new index folder (it must not hold an index), which the index lives in from then on.
        ``save()``, or ``save`` to the folder it lives in: append the items added since it was opened or saved, as
        a new generation (``deepmetric index --add``'s way: a reader sees the old index or the new one, whole).

        Examples:
            >>> index.save("gallery-index"); index.add(more); index.save()
        """
        if path is not None:
            target = Path(path)
        elif self.index_dir is not None:
            target = self.index_dir
        else:
            raise IndexStoreError("this index has no folder yet: give one, index.save(folder)")
        if self.index_dir is not None and os.path.realpath(target) == os.path.realpath(self.index_dir):
            return self._append()
        manifest = IndexManifest(kind=self.kind, model=dict(self.manifest.model), embedding_dim=self.embedding_dim,
                                 items=list(self.manifest.items), sources=list(self.manifest.sources),
                                 generation=self.manifest.generation, ivf_pq=self.manifest.ivf_pq)
        create_index(target, manifest, self.embeddings, self.index)
        self.manifest = manifest
        self.index_dir, self._saved, self._generation = target, manifest.count, manifest.generation
        return target

    def _append(self) -> Path:
        folder = self.index_dir
        assert folder is not None
        if self._saved == self.count:
            return folder
        with locked(folder):
            current = read_manifest(folder)
            if current.generation != self._generation or current.count != self._saved:
                raise IndexStoreError(f"{folder} was changed by another writer since this index was read from it (it "
                                      f"holds {current.count} items, generation {current.generation}; this index "
                                      f"read {self._saved}, generation {self._generation}): open it again and add "
                                      "to that, or save this one to a new folder")
            new = [{k: v for k, v in item.items() if k != "id"} for item in self.manifest.items[self._saved:]]
            rows = self.embeddings[self._saved:] if self.exact is not None else np.asarray(
                self.index.reconstruct_n(self._saved, self.count - self._saved), dtype=np.float32)
            updated = append_to_index(folder, current, rows, new, list(self.manifest.sources))
        self.manifest = updated
        self._saved, self._generation = updated.count, updated.generation
        return folder


def _vector_records(count: int, names: Sequence[str] | None) -> list[dict[str, Any]]:
    return _named([{"source": 0, "path": None} for _ in range(count)], names)


def _named(records: list[dict[str, Any]], names: Sequence[str] | None) -> list[dict[str, Any]]:
    """``records`` with ``names`` (one non-empty string each) as their ``name``."""
    if names is None:
        return records
    if isinstance(names, str) or len(names) != len(records):
        count = 1 if isinstance(names, str) else len(names)
        raise DataError(f"names must be a list of one name per image, got {count} for {len(records)} images")
    bad = [i for i, name in enumerate(names) if not isinstance(name, str) or not name]
    if bad:
        raise DataError(f"names[{bad[0]}] is {names[bad[0]]!r}; a name is a non-empty string")
    return [{**record, "name": name} for record, name in zip(records, names, strict=True)]


def _gallery(images: Any) -> tuple[list[Path | Image.Image | np.ndarray], list[dict[str, Any]], str | None]:
    """``(items to embed, their item records without ids, gallery folder or None)``. A path is taken as
    ``deepmetric index --images`` takes it (``gallery_files``); in a list, a file is named by its path below the
    folder holding every listed file, an image in memory has no path."""
    if isinstance(images, str | os.PathLike):
        root, files = gallery_files(images)
        return list(files), [relative_item(f, root, 0) for f in files], str(root)
    items = image_items(images)
    files = [p.parent.resolve() / p.name for p in items if isinstance(p, Path)]  # as gallery_files: folder links
    for file in files:
        if not file.is_file():
            raise DataError(f"{file} is not a file")
    if not files:
        return items, [{"source": 0, "path": None} for _ in items], None
    root = folder_holding(files)
    resolved = iter(files)
    items = [next(resolved) if isinstance(item, Path) else item for item in items]
    records = [relative_item(item, root, 0) if isinstance(item, Path) else {"source": 0, "path": None}
               for item in items]
    return items, records, str(root)
