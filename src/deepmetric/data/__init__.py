"""Data: the ``RetrievalDataset`` table, its loaders, the P x K sampler and the transforms.

``load_dataset(spec)`` is the one entry point; a spec is a loader name, optionally with a path:

| spec | what |
|---|---|
| ``glyphs[:PATH]`` | the offline demo set (built on first use) |
| ``fashion-mnist[:PATH]`` | Fashion-MNIST, classes 0-4 train / 5-9 test |
| ``digits`` | scikit-learn's 8x8 digits, 0-4 train / 5-9 test |
| ``folder:PATH`` | one sub-folder per class; sorted names, first half train |
| ``csv:PATH`` | columns ``path,label,split[,is_query,is_gallery]`` |
| ``cub:PATH`` ``cars:PATH`` ``sop:PATH`` ``inshop:PATH`` | the benchmarks, official layouts |
| ``cub-cropped:PATH`` ``cars-cropped:PATH`` | CUB / Cars with every image cut to its bounding box (ABE Table 5) |
"""

from __future__ import annotations

import numpy as np

from ..errors import DataError, did_you_mean
from .benchmarks import load_cars, load_cub, load_inshop, load_sop
from .generic import load_csv, load_digits, load_fashion_mnist, load_folder
from .glyphs import GLYPH_CHARS, build_glyphs, load_glyphs
from .sampler import PKSampler
from .table import RetrievalDataset, check_paths_exist
from .transforms import TestTransform, TrainTransform

LOADERS = ("glyphs", "fashion-mnist", "digits", "folder", "csv", "cub", "cars", "sop", "inshop", "cub-cropped",
           "cars-cropped")
NEEDS_PATH = ("folder", "csv", "cub", "cars", "sop", "inshop", "cub-cropped", "cars-cropped")

__all__ = [
    "GLYPH_CHARS", "LOADERS", "PKSampler", "RetrievalDataset", "TestTransform", "TrainTransform",
    "build_glyphs", "carve_validation", "load_dataset",
]


def parse_spec(spec: str) -> tuple[str, str | None]:
    name, _, path = spec.partition(":")
    name = name.strip().lower()
    if name not in LOADERS:
        raise DataError(f"unknown data set '{name}'{did_you_mean(name, LOADERS)}; expected one of "
                        f"{', '.join(LOADERS)} (folder, csv and the benchmarks take :PATH)")
    if name in NEEDS_PATH and not path:
        raise DataError(f"data set '{name}' needs a path: {name}:PATH")
    return name, (path or None)


def carve_validation(table: RetrievalDataset, fraction: float, seed: int = 0) -> RetrievalDataset:
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
                 val_seed: int = 0, check_files: bool = True) -> RetrievalDataset:
    """Load the table named by ``spec`` with its zero-shot split (and an optional validation split).

    ``check_files`` fails, naming them, when listed image files do not exist (the training flow turns it
    off because its audit, ``data.audit``, reports missing files together with every other problem).
    """
    name, path = parse_spec(spec)
    if name == "glyphs":
        table = load_glyphs(path, seed=seed)
    elif name == "fashion-mnist":
        table = load_fashion_mnist(path)
    elif name == "digits":
        table = load_digits()
    elif name == "folder":
        table = load_folder(path)
    elif name == "csv":
        table = load_csv(path)
    else:
        base, _, cropped = name.partition("-")
        loader = {"cub": load_cub, "cars": load_cars, "sop": load_sop, "inshop": load_inshop}[base]
        table = loader(path, check=check_counts, **({"crop": True} if cropped else {}))
    table.meta["spec"] = spec
    if check_files and not table.in_memory:
        check_paths_exist(table.name, [str(p) for p in table.images], path or table.name)
    return carve_validation(table, val_fraction, val_seed)
