"""The Python API for trained runs: load a run, embed images exactly as ``deepmetric embed`` does, and build, extend,
save, open and search the retrieval indexes ``deepmetric index`` writes.

```python
import deepmetric

run = deepmetric.load_run("runs/cub")            # checkpoint "auto": best when it exists, else last (as the CLI)
x = run.embed(["a.jpg", "b.png"])                # (2, D) float32, l2-normalised: what `deepmetric embed` writes
index = deepmetric.Index.build(run, "gallery/", "gallery-index")   # the folder `deepmetric index` writes
for hit in index.search("query.jpg", k=5)[0]:    # one list of hits per query, best first
    print(hit.id, hit.name, hit.score)
```

Nothing here embeds, stores or searches on its own: images go through the library's reader (``read_image``,
``to_rgb``), the run's ``TestTransform`` and ``embed_table``, as ``deepmetric embed`` and ``deepmetric index`` do;
an index is written and read by ``retrieval.store`` and searched by ``retrieval.search.IndexSearcher``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from .config import RunConfig
from .data.images import read_image, to_rgb
from .data.table import RetrievalTable
from .errors import CheckpointError, DataError, IndexStoreError
from .evaluation import EmbedSettings, embed_table
from .io import check_writable
from .models import Embedder
from .retrieval import faiss_index
from .retrieval.build import check_same_model, gallery_files, model_record, relative_item
from .retrieval.search import Hit, IndexSearcher, index_checkpoint
from .retrieval.store import IndexManifest, append_to_index, create_index, locked, read_manifest
from .training.run_dir import RunDir, load_run_checkpoint, model_from_checkpoint
from .training.setup import resolve_device

__all__ = ["Hit", "Index", "TrainedRun", "load_run"]

ImageInput = str | os.PathLike | Image.Image | np.ndarray | torch.Tensor
"""One image: a file path, a PIL image (any mode), a uint8 numpy array (H, W), (H, W, 3) RGB or (H, W, 4) RGBA, or
a tensor (C, H, W) or (H, W), C in 1, 3, 4, of uint8 or of floats in [0, 1] (torchvision's layouts)."""

CHECKPOINTS = ("auto", "best", "last")


class _ImagesTable(RetrievalTable):
    """A table of checked images (``_image_items``): each row is read when the loader asks for it, a file by the
    library's reader (``read_image``, as ``deepmetric embed``), a PIL image or an RGBA / gray array by ``to_rgb``."""

    def image(self, index: int) -> np.ndarray:
        item = self.images[index]
        if isinstance(item, Path):
            return read_image(item)
        if isinstance(item, np.ndarray):
            if item.ndim == 3 and item.shape[2] == 3:
                return np.array(item)  # a copy: torch warns of a read-only one (np.asarray of a PIL image)
            item = Image.fromarray(item)  # (H, W): L; (H, W, 4): RGBA, composited on white by to_rgb
        else:
            item.load()  # as read_image: the pixels, and the info (transparency) some formats only fill in then
        return np.array(to_rgb(item), dtype=np.uint8)

    def describe(self, index: int) -> str:
        item = self.images[index]
        return str(item) if isinstance(item, Path) else f"images[{index}]"


def _tensor_array(tensor: torch.Tensor, where: str) -> np.ndarray:
    """A (C, H, W) or (H, W) tensor of uint8 or of floats in [0, 1] as a uint8 (H, W[, C]) array."""
    t = tensor.detach().cpu()
    if t.is_floating_point():
        if not torch.isfinite(t).all() or t.numel() and (t.min() < 0 or t.max() > 1):
            raise DataError(f"{where} is a float tensor with values outside [0, 1]; give floats in [0, 1] or uint8")
        t = (t.float() * 255).round().to(torch.uint8)
    elif t.dtype != torch.uint8:
        raise DataError(f"{where} is a {t.dtype} tensor; give uint8 or floats in [0, 1]")
    if t.ndim == 3:
        if t.shape[0] not in (1, 3, 4):
            raise DataError(f"{where} is a tensor of shape {tuple(t.shape)}; expected (C, H, W) with C in 1, 3, 4, "
                            "or (H, W)")
        t = t.permute(1, 2, 0)
    return t.numpy()


def _checked_array(array: np.ndarray, where: str) -> np.ndarray:
    if array.dtype != np.uint8:
        raise DataError(f"{where} is a {array.dtype} array; images as arrays are uint8 (H, W), (H, W, 3) RGB or "
                        "(H, W, 4) RGBA (a float array is taken for embeddings where a search accepts them)")
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.ndim not in (2, 3) or array.ndim == 3 and array.shape[2] not in (3, 4) or 0 in array.shape:
        raise DataError(f"{where} is an array of shape {array.shape}; expected (H, W), (H, W, 3) RGB or (H, W, 4) "
                        "RGBA")
    return np.ascontiguousarray(array)


def _image_item(item: Any, where: str) -> Path | Image.Image | np.ndarray:
    """``item`` checked: a Path, a PIL image, or a uint8 (H, W), (H, W, 3) or (H, W, 4) array."""
    if isinstance(item, str | os.PathLike):
        path = Path(item)
        if path.is_dir():
            raise DataError(f"{where}: {path} is a folder; give its image files, e.g. "
                            "deepmetric.workflows.list_images(folder) (the files, in the order, deepmetric embed "
                            "takes), or build an Index from the folder")
        return path
    if isinstance(item, Image.Image):
        return item
    if isinstance(item, torch.Tensor):
        item = _tensor_array(item, where)
    if isinstance(item, np.ndarray):
        return _checked_array(item, where)
    raise DataError(f"{where} is a {type(item).__name__}; expected an image: a path, a PIL image, a uint8 numpy "
                    "array (H, W), (H, W, 3) or (H, W, 4), or a tensor (C, H, W)")


def _image_items(images: Any) -> list[Path | Image.Image | np.ndarray]:
    """A single image or a sequence of them (a 4-D array (N, H, W, C) or tensor (N, C, H, W) is a batch), checked."""
    if isinstance(images, str | os.PathLike | Image.Image) or (
            isinstance(images, np.ndarray | torch.Tensor) and images.ndim < 4):
        return [_image_item(images, "the image")]
    if not isinstance(images, Sequence | np.ndarray | torch.Tensor):
        raise DataError(f"images must be an image or a list of them, got a {type(images).__name__}")
    return [_image_item(item, f"images[{i}]") for i, item in enumerate(images)]


def _is_vectors(x: Any) -> bool:
    """Embeddings rather than images: a float numpy array or tensor of one (D,) or several (N, D) rows."""
    if isinstance(x, torch.Tensor):
        return x.is_floating_point() and x.ndim in (1, 2)
    return isinstance(x, np.ndarray) and np.issubdtype(x.dtype, np.floating) and x.ndim in (1, 2)


def _unit_rows(x: np.ndarray | torch.Tensor, dim: int | None, what: str) -> np.ndarray:
    """(N, D) float32 rows of ``x`` l2-normalised (an index scores by inner product: cosine for unit rows)."""
    array = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    array = np.atleast_2d(array).astype(np.float32)
    if dim is not None and array.shape[1] != dim:
        raise IndexStoreError(f"{what} have {array.shape[1]} dimensions; the index holds {dim}-d embeddings")
    if not np.isfinite(array).all():
        raise IndexStoreError(f"{what} hold NaN or infinite values")
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    if (norms == 0).any():
        raise IndexStoreError(f"{what} hold {int((norms == 0).sum())} all-zero row(s), which have no direction")
    return np.ascontiguousarray(array / norms, dtype=np.float32)


class TrainedRun:
    """A trained run's model, ready to embed images exactly as ``deepmetric embed`` does (``load_run`` makes one).

    Attributes:
        path: the run directory.
        config: its resolved config (``RUN/config.yaml``).
        checkpoint: the checkpoint file whose weights were loaded.
        step: the training step of that checkpoint (None when it does not say).
        model: the ``Embedder``, in eval mode while embedding, on ``device``.
        device: where the model runs.
        image_size, test_resize: the test-time preprocessing (``data.image_size``, ``data.test_resize``; for a run
            loaded by an ``Index``, the index's).

    Example:
        >>> run = deepmetric.load_run("runs/cub", device="cpu")
        >>> run.embed(["a.jpg", PIL.Image.open("b.png")]).shape   # (2, run.embedding_dim)
    """

    def __init__(self, path: Path, config: RunConfig, model: Embedder, checkpoint: Path, state: dict[str, Any],
                 device: torch.device):
        self.path = path
        self.config = config
        self.model = model
        self.checkpoint = checkpoint
        self.step: int | None = state.get("step")
        self.device = device
        self.image_size: int = config.data.image_size
        self.test_resize: str = config.data.test_resize

    @property
    def embedding_dim(self) -> int:
        """D, the width of the model's embeddings (a head may round the configured size down: DeML's 504 of 512)."""
        return int(self.model.embedding_dim)

    def __repr__(self) -> str:
        return (f"TrainedRun({str(self.path)!r}, checkpoint={self.checkpoint.name!r}, step={self.step}, "
                f"{self.embedding_dim}-d, {self.image_size} px {self.test_resize}, device={str(self.device)!r})")

    def to(self, device: str | torch.device) -> TrainedRun:
        """Move the model to ``device`` (``cpu``, ``cuda``, ``cuda:1``, ``auto``: a GPU when torch sees one);
        returns the run.

        Example:
            >>> run = deepmetric.load_run("runs/cub").to("cpu")
        """
        target = resolve_device(str(device))
        if target != self.device:
            self.model.to(target)
            self.device = target
        return self

    def embed_settings(self, count: int, batch_size: int | None = None, progress: bool | None = None) -> EmbedSettings:
        """How ``count`` images are embedded: the run's settings, as ``deepmetric embed`` takes them
        (``EmbedSettings.from_config``), with this run's size and resize. ``progress`` None: a bar (on standard
        error) when there is more than one batch. A single batch is decoded in this process, without workers."""
        settings = EmbedSettings.from_config(self.config, self.device, False, batch_size)
        show = count > settings.batch_size if progress is None else progress
        settings = dataclasses.replace(settings, image_size=self.image_size, test_resize=self.test_resize,
                                       progress=show)
        return settings if count > settings.batch_size else dataclasses.replace(settings, num_workers=0)

    def embed(self, images: ImageInput | Sequence[ImageInput], batch_size: int | None = None,
              device: str | torch.device | None = None, progress: bool | None = None) -> np.ndarray:
        """(N, D) float32 l2-normalised embeddings of ``images``, one row per image in order (N = 1 for one image).

        The numbers are those ``deepmetric embed`` writes for the same files: a file is read by the library's reader
        (``deepmetric.data.images.read_image``: any PIL mode to RGB, transparency composited on white), a PIL image
        or array goes through the same ``to_rgb``, then the run's ``TestTransform`` and model, in batches.

        Args:
            images: one image or a list of them: file paths (str or Path), PIL images (any mode), uint8 numpy arrays
                (H, W) gray, (H, W, 3) RGB or (H, W, 4) RGBA, tensors (C, H, W) or (H, W) of uint8 or floats in
                [0, 1]; a 4-D array (N, H, W, C) or tensor (N, C, H, W) is a batch.
            batch_size: images per forward pass (default: the run's ``eval.batch_size``, as the CLI).
            device: move the model there first (it stays there; see ``to``); default: where it is.
            progress: a progress bar on standard error; None: when there is more than one batch.

        Example:
            >>> x = run.embed(["cat.png", np.zeros((32, 32, 3), np.uint8)])
            >>> x.shape, float(x[0] @ x[1])   # ((2, D), the cosine similarity of the two)
        """
        items = _image_items(images)
        if device is not None:
            self.to(device)
        if not items:
            return np.zeros((0, self.embedding_dim), dtype=np.float32)
        table = _ImagesTable(name="images", images=items, labels=np.zeros(len(items)),
                             splits=np.array(["test"] * len(items), dtype=object),
                             is_query=np.ones(len(items), bool), is_gallery=np.ones(len(items), bool))
        embeddings = embed_table(self.model, table, self.embed_settings(len(items), batch_size, progress))
        return embeddings.astype(np.float32, copy=False)


def load_run(path: str | os.PathLike[str], checkpoint: str | os.PathLike[str] = "auto",
             device: str | torch.device | None = None) -> TrainedRun:
    """Load a trained run directory's model, to embed images with exactly its preprocessing (``TrainedRun.embed``).

    Args:
        path: the run directory (``deepmetric train --out``).
        checkpoint: ``auto`` (the default, as the CLI's ``--checkpoint``): ``best`` when the run has one (it had a
            validation split), else ``last``; ``best`` or ``last`` for that one; or the path of a checkpoint file.
        device: where the model runs (``cpu``, ``cuda``, ``cuda:1``, ``auto``); default (None): the run's
            ``train.device`` as the CLI resolves it, so ``auto``, the usual setting, is a GPU when torch sees one,
            else the CPU. Give ``device="cpu"`` to keep a GPU free, or for a run trained with ``train.device=cuda``
            loaded on a machine without one.

    Example:
        >>> import deepmetric
        >>> run = deepmetric.load_run("runs/cub")
        >>> run.checkpoint.name, run.embedding_dim, run.image_size   # ('best.safetensors', 512, 224)
        >>> x = run.embed(["a.jpg", "b.png"])                       # == `deepmetric embed runs/cub` of the two files
    """
    run_dir = RunDir(path)
    config = run_dir.config()
    target = resolve_device(config.train.device if device is None else str(device))
    if str(checkpoint) in CHECKPOINTS:
        model, config, file, _, state = load_run_checkpoint(run_dir.path, str(checkpoint), target)
    else:
        file = Path(checkpoint)
        if not file.is_file():
            raise CheckpointError(f"checkpoint {file} is not a file (give auto, best, last or a checkpoint file)")
        model, state = model_from_checkpoint(file, target)
        model.set_channels_last(config.train.channels_last)
    return TrainedRun(run_dir.path, config, model, file, state, target)


class Index(IndexSearcher):
    """A retrieval index in Python, over the folder ``deepmetric index`` writes (``retrieval/store.py``): cosine
    search of l2-normalised embeddings (exact ``flat``, or ``ivf-pq`` re-ranked exactly, ``retrieval/search.py``).

    Make one with ``Index.build(run, images)`` (embed a gallery with a run), ``Index.from_embeddings(x)`` or
    ``Index.open(folder)`` (``Index.load`` alike); ``add`` more, ``search`` by images or embeddings, ``save``.
    An index lives in memory until ``save``: ``save(folder)`` writes a new index folder, ``save()`` appends what was
    added since to the folder it was opened from or saved to (as ``deepmetric index --add``).

    Items are named, in search results, by the name given to them, else by their path relative to their gallery
    folder (as ``deepmetric search`` names them), else ``#id``.

    Example:
        >>> run = deepmetric.load_run("runs/cub")
        >>> index = deepmetric.Index.build(run, "gallery/", "gallery-index")   # as `deepmetric index`
        >>> index.add(["new/1.jpg", "new/2.jpg"]); index.save()
        >>> [(h.id, h.name, h.score) for h in index.search("query.jpg", k=3)[0]]
    """

    def __init__(self, manifest: IndexManifest, index: Any, embeddings: np.ndarray, run: TrainedRun | None = None,
                 path: Path | None = None, device: str | torch.device | None = None, verify_checkpoint: bool = True):
        """Internal: use ``build``, ``from_embeddings`` or ``open``."""
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

        Example:
            >>> index = deepmetric.Index.from_embeddings(np.random.randn(100, 16), names=[f"v{i}" for i in range(100)])
            >>> index.search(np.random.randn(16), k=5)[0][0].name
        """
        x = _unit_rows(embeddings, run.embedding_dim if run else None, "the embeddings")
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
            kind, nlist, pq_m: as ``from_embeddings``.
            batch_size, progress: as ``TrainedRun.embed``.

        Example:
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

        Example:
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
        return (f"Index({where}, {self.kind}, {self.count} items of {self.embedding_dim}-d"
                + (f", {pending} unsaved" if pending else "") + ")")

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
        checkpoint = index_checkpoint(where, model, self._verify)
        run = load_run(model["run_dir"], checkpoint, self._device)
        run.image_size, run.test_resize = int(model["image_size"]), model["test_resize"]
        return run

    # -- changing, searching, saving ----------------------------------------------------------------------------

    def add(self, images: Any, names: Sequence[str] | None = None, batch_size: int | None = None,
            progress: bool | None = None) -> list[int]:
        """Add images (as ``build`` takes them, embedded by ``run``) or embeddings (a float (N, D) or (D,) array or
        tensor, l2-normalised here); returns their ids. Nothing is skipped (``deepmetric index --add`` skips files
        already indexed); ``save`` writes them.

        Example:
            >>> ids = index.add(["new/1.jpg", "new/2.jpg"], names=["one", "two"]); index.save()
        """
        if _is_vectors(images):
            x = _unit_rows(images, self.embedding_dim, "the embeddings")
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
               progress: bool | None = None) -> list[list[Hit]]:
        """The ``k`` nearest items (at most the index size) of each query, best first: one list of ``Hit`` (``id``,
        ``name``, cosine ``score``) per query, also for a single query.

        Args:
            queries: embeddings, a float (N, D) or (D,) numpy array or tensor (l2-normalised here); or images as
                ``TrainedRun.embed`` takes them (a path, a PIL image, a uint8 array, or a list), embedded by
                ``run``: the same hits as ``deepmetric search INDEX --image FILE``.
            k: how many hits per query.
            batch_size, progress: as ``TrainedRun.embed``.

        Example:
            >>> hits = index.search("query.jpg", k=5)[0]
            >>> [(h.name, round(h.score, 3)) for h in hits]
        """
        if _is_vectors(queries):
            x = _unit_rows(queries, self.embedding_dim, "the queries")
        else:
            x = self.run.embed(queries, batch_size=batch_size, progress=progress)
        if len(x) == 0:
            return []
        return self.search_vectors(x, k)

    def save(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Write the index; returns its folder.

        ``save(folder)``: a new index folder (it must not hold an index), which the index lives in from then on.
        ``save()``, or ``save`` to the folder it lives in: append the items added since it was opened or saved, as
        a new generation (``deepmetric index --add``'s way: a reader sees the old index or the new one, whole).

        Example:
            >>> index.save("gallery-index"); index.add(more); index.save()
        """
        if path is None and self.index_dir is None:
            raise IndexStoreError("this index has no folder yet: give one, index.save(folder)")
        target = Path(path) if path is not None else self.index_dir
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
    items = _image_items(images)
    files = [p.parent.resolve() / p.name for p in items if isinstance(p, Path)]  # as gallery_files: folder links
    for file in files:
        if not file.is_file():
            raise DataError(f"{file} is not a file")
    if not files:
        return items, [{"source": 0, "path": None} for _ in items], None
    root = Path(os.path.commonpath([f.parent for f in files]))
    resolved = iter(files)
    items = [next(resolved) if isinstance(item, Path) else item for item in items]
    records = [relative_item(item, root, 0) if isinstance(item, Path) else {"source": 0, "path": None}
               for item in items]
    return items, records, str(root)
