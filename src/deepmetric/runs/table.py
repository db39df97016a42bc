"""The data table a run's config names: its data set with the validation split carved out, audited."""

from __future__ import annotations

import numpy as np

from ..config import RunConfig
from ..data import carve_validation, load_dataset
from ..data.audit import BadItem, check_table
from ..data.table import RetrievalTable, recheck_test_counts
from ..errors import DataError


def load_table(config: RunConfig, progress: bool = False,
               only_split: str | None = None) -> tuple[RetrievalTable, list[BadItem]]:
    """The run's data set with its validation split (or only ``only_split`` of it), audited
    (``data.check_images``): bad items stop the run with their list, or are left out
    (``data.skip_bad_images``) and returned."""
    d = config.data
    table = load_dataset(d.spec, seed=d.seed, check_counts=d.check_counts, check_files=not d.check_images,
                         skip_bad=d.skip_bad_images)
    if only_split is None:  # training: the validation share and the batch checked together
        table = carve_checked(table, d.val_fraction, d.val_seed, d.classes_per_batch)
    else:
        table = carve_validation(table, d.val_fraction, d.val_seed)
    if only_split:
        table = table.split(only_split)
    if not d.check_images:
        return table, []
    checked, bad = check_table(table, d.skip_bad_images, progress)
    if len(checked) < len(table):  # bad items left out: the test split may no longer be the protocol's
        recheck_test_counts(checked, d.check_counts)
    return checked, bad


def carve_checked(table: RetrievalTable, val_fraction: float, val_seed: int,
                  classes_per_batch: int) -> RetrievalTable:
    """``carve_validation`` for a training run, refusing in one message that names every setting to change, with a
    value that fits, a data set too small for the validation share and the P x K batch together (a small folder
    was refused one setting at a time, the second message naming no key)."""
    classes = table.classes("train")
    n_val = int(round(val_fraction * len(classes))) if val_fraction > 0 else 0
    problems = []
    if val_fraction > 0 and (n_val < 2 or len(classes) - n_val < 2):
        problems.append(f"data.val_fraction={val_fraction} of its {len(classes)} training classes leaves {n_val} "
                        f"validation and {len(classes) - n_val} training classes, both need at least 2: set "
                        "data.val_fraction=0 (no validation: the last step is kept)"
                        + (f" or at least {2 / len(classes):.2g}" if len(classes) >= 4 else ""))
    else:
        table = carve_validation(table, val_fraction, val_seed)
    _, counts = np.unique(table.labels[table.splits == "train"], return_counts=True)
    usable = int((counts >= 2).sum())
    if usable < classes_per_batch:
        left = "left for training" if "val" in set(table.splits) else "in the training split"
        problems.append(f"data.classes_per_batch={classes_per_batch} (P of a P x K batch) needs {classes_per_batch} "
                        f"classes with at least 2 images, {usable} are {left}: set data.classes_per_batch="
                        f"{max(usable, 2)}" + (" or fewer" if usable > 2 else "")
                        + (" or a smaller data.val_fraction" if left == "left for training" else ""))
    if problems:
        raise DataError(f"{table.name} is too small for these settings: " + "; ".join(problems))
    return table
