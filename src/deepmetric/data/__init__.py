"""Data: the ``RetrievalTable`` table, its loaders, the P x K sampler and the transforms.

``load_dataset(spec)`` is the one entry point; a spec is a loader name, optionally with a path:

| spec | what |
|---|---|
| ``glyphs[:PATH]`` | the offline toy set (built on first use) |
| ``emoji[:PATH]`` ``emoji-skin[:PATH]`` | five vendors' drawings of 1,633 emoji (npm packages, fetched on first use) |
| ``icons[:PATH]`` | freedesktop icon names drawn by 14 Debian icon-theme packages (.deb packages, built on first use) |
| ``fashion-mnist[:PATH]`` | Fashion-MNIST, classes 0-4 train / 5-9 test |
| ``digits`` | scikit-learn's 8x8 digits, 0-4 train / 5-9 test |
| ``folder:PATH`` | one sub-folder per class; sorted names, first half train |
| ``csv:PATH`` | columns ``path,label,split[,is_query,is_gallery]`` |
| ``cub[:PATH]`` ``cars:PATH`` ``sop:PATH`` ``inshop:PATH`` | the benchmarks, official layouts (``cub``: fetched) |
| ``cub-cropped[:PATH]`` ``cars-cropped:PATH`` | CUB / Cars with every image cut to its bounding box (ABE Table 5) |

``cub`` and ``cub-cropped`` without a path fetch the publisher's archive to ``$DEEPMETRIC_DATA/cub`` on first use
(``download``); ``cars``, ``sop`` and ``inshop`` without one say where their official files are.

A ``PATH`` is read, never created, except ``glyphs:PATH`` (where the toy set is built): ``check_data_path`` refuses
one that does not exist (``cub: no such folder: /data/CUB``) before anything slow: ``load_dataset``, ``train``,
``evaluate``, ``report``, ``explain`` and ``study --dry-run`` call it first.
"""

from __future__ import annotations

import inspect
import os
import stat
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DataError, MissingDataPath
from .download import manual_download
from .glyphs import GLYPH_CHARS, build_glyphs
from .registry import DATASETS, PATH_KINDS

# isort: off
from . import glyphs, generic, benchmarks, emoji, icons  # noqa: F401, E402 (each registers its loaders, in this order)
# isort: on
from .sampler import PKSampler
from .table import RetrievalDataset, RetrievalTable, check_paths_exist, check_protocol

if TYPE_CHECKING:  # what __getattr__ gives, for type checkers
    from .torch_dataset import ImageDataset
    from .transforms import TestTransform, TrainTransform

__all__ = [
    "DATASETS", "GLYPH_CHARS", "ImageDataset", "PKSampler", "RetrievalDataset", "RetrievalTable", "TestTransform",
    "TrainTransform", "build_glyphs", "carve_validation", "check_data_path", "load_dataset",
]


def __getattr__(name: str) -> Any:
    """The transforms (torchvision) and the torch dataset are imported on first use: the config checks
    ``data.resizing``'s choices without the data pipeline."""
    if name in ("TestTransform", "TrainTransform"):
        from . import transforms

        return getattr(transforms, name)
    if name == "ImageDataset":
        from .torch_dataset import ImageDataset

        return ImageDataset
    raise AttributeError(f"module 'deepmetric.data' has no attribute '{name}'")


def needs_path(name: str) -> bool:
    """Whether data set ``name`` must be given as ``name:PATH`` (its loader's ``path`` has no default); an unknown
    name is refused with the nearest valid one."""
    parameter = inspect.signature(DATASETS.get(name)).parameters.get("path")
    return parameter is not None and parameter.default is inspect.Parameter.empty


def takes_path(name: str) -> bool:
    """Whether data set ``name``'s loader reads a ``PATH`` at all (``digits`` does not)."""
    return "path" in inspect.signature(DATASETS.get(name)).parameters


def parse_spec(spec: str) -> tuple[str, str | None]:
    """``NAME[:PATH]`` as ``(name, path or None)``, ``~`` in the path expanded (a shell leaves ``--data emoji:~/x``
    unexpanded, and a YAML config never expands it). A loader that needs a path and has none, or reads none and is
    given one (``digits:/data``), is refused."""
    name, _, path = spec.partition(":")
    name = name.strip().lower()
    if name not in DATASETS:
        _refuse_a_bare_path(spec)
    if needs_path(name) and not path:
        how = manual_download(name)
        raise DataError(f"data set '{name}' needs a path: {name}:PATH" + (f". {how}" if how else ""))
    if path and not takes_path(name):
        raise DataError(f"data set '{name}' reads no path (it is built in): give '{name}', not '{spec}'")
    return name, (os.path.expanduser(path) if path else None)


def _refuse_a_bare_path(spec: str) -> None:
    """A spec that is no data set's name but a path that exists (``--data icons/``, ``--data labels.csv``: the
    ``folder:`` or ``csv:`` forgotten) is refused saying which spec reads it, rather than suggesting the nearest
    data set's name."""
    given = os.path.expanduser(spec)
    try:
        is_folder, is_file = os.path.isdir(given), os.path.isfile(given)
    except (OSError, ValueError):
        return
    if is_folder:
        raise DataError(f"unknown data set '{spec}': {spec} is a folder; to train on its class sub-folders "
                        f"(FOLDER/<class>/<image>) give --data folder:{spec}")
    if is_file and given.lower().endswith(".csv"):
        raise DataError(f"unknown data set '{spec}': {spec} is a CSV file; to read it (columns path, label, split) "
                        f"give --data csv:{spec}")


def check_data_path(spec: str) -> None:
    """Refuse ``spec``'s ``PATH`` unless it exists and is what its loader reads (``PATH_KINDS``), in a few
    microseconds: ``cub: no such folder: /data/CUB``, ``csv: /data is a folder, not a file``. A spec without a path
    (and ``glyphs:PATH``, built there) passes; an unknown name is refused with the nearest valid one."""
    name, path = parse_spec(spec)
    kind = PATH_KINDS.get(name, "file or folder")
    if path is None or kind in ("built", "none"):
        return
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise MissingDataPath(f"{name}: no such {kind}: {path}") from None
    except (OSError, ValueError) as error:  # a folder on the way that cannot be entered; a NUL in the path
        raise DataError(f"{name}: {path} cannot be read: {getattr(error, 'strerror', None) or error}") from None
    if kind == "folder" and not stat.S_ISDIR(mode):
        raise DataError(f"{name}: {path} is not a folder")
    if kind == "file" and stat.S_ISDIR(mode):
        raise DataError(f"{name}: {path} is a folder, not a file")


def carve_validation(table: RetrievalTable, fraction: float, seed: int = 0) -> RetrievalTable:
    """Move a seeded random ``fraction`` of the training classes (class-disjoint) to the ``val`` split."""
    if fraction <= 0:
        return table
    classes = table.classes("train")
    n_val = int(round(fraction * len(classes)))
    if n_val < 2 or len(classes) - n_val < 2:
        raise DataError(f"{table.name}: data.val_fraction={fraction} of {len(classes)} training classes leaves "
                        f"{n_val} validation and {len(classes) - n_val} training classes; both need at least 2")
    val_classes = np.random.default_rng(seed).permutation(classes)[:n_val]
    moved = (table.splits == "train") & np.isin(table.labels, val_classes)
    splits = table.splits.copy()
    splits[moved] = "val"
    table.splits = splits
    table.meta["val_classes"] = sorted(int(c) for c in val_classes)
    return table


def load_dataset(spec: str, *, seed: int = 0, check_counts: bool = True, val_fraction: float = 0.0,
                 val_seed: int = 0, check_files: bool = True, skip_bad: bool = False) -> RetrievalTable:
    """Load the table named by ``spec`` with its zero-shot split (and an optional validation split).

    Args:
        spec: ``NAME`` or ``NAME:PATH`` of a ``DATASETS`` loader (the module docstring lists them).
        seed: the data set's own seed where it has one (the glyphs character split).
        check_counts: refuse a benchmark whose split sizes differ from the published ones.
        val_fraction: the fraction of training classes moved to a class-disjoint ``val`` split.
        val_seed: which classes move.
        check_files: fail, naming them, when listed image files do not exist (the training flow turns it off:
            its audit, ``data.audit``, reports missing files together with every other problem).
        skip_bad: (``data.skip_bad_images``) let a loader leave out the rows it can (a CSV's repeated image).

    Returns:
        The ``RetrievalTable``, its zero-shot protocol checked (``check_protocol``).
    """
    check_data_path(spec)
    name, path = parse_spec(spec)
    table = DATASETS.build(name, path=path, seed=seed, check=check_counts, skip_bad=skip_bad)
    table.meta["spec"] = spec
    if check_files and not table.in_memory:
        check_paths_exist(table.name, [str(p) for p in table.images], path or table.name)
    check_protocol(table)
    return carve_validation(table, val_fraction, val_seed)
