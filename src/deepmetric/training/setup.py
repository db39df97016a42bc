"""Building a run's pieces from its config: device, seeds, the audited data table, the model, the baseline."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from ..config import RunConfig
from ..data import carve_validation, load_dataset
from ..data.audit import BadItem, check_table
from ..data.table import RetrievalTable, recheck_test_counts
from ..errors import DataError, DeepMetricError
from ..evaluation import EmbedSettings, evaluate
from ..models import Embedder, create_model
from ..provenance import evaluation_environment

COMPUTE_DEVICES = ("cpu", "cuda")
"""The device types deepmetric runs a model on (torch knows 20 more: ``meta`` holds shapes without numbers)."""


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``train.device`` as a device (auto: this rank's GPU, else the CPU). ``cuda`` without an index is this rank's
    GPU too (``cuda:LOCAL_RANK``). A GPU becomes the current CUDA device, so that CUDA work given no device (NCCL's
    collectives, the cuda kNN engine) runs on it, not on GPU 0."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise DeepMetricError(f"train.device={name} but torch sees no CUDA device")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise DeepMetricError(f"device '{name}' is not one torch knows: give auto, cpu, cuda or cuda:N") from None
    if device.type not in COMPUTE_DEVICES:  # load_run(device='meta') loaded a run that could embed nothing
        raise DeepMetricError(f"device '{name}' is not one deepmetric computes on: give auto, cpu, cuda or cuda:N")
    if device.type == "cuda":
        if device.index is None:  # torch.cuda.set_device refuses a device without an index
            device = torch.device("cuda", local_rank)
        if device.index >= torch.cuda.device_count():
            raise DeepMetricError(f"train.device={name} is GPU {device.index}, but torch sees "
                                  f"{torch.cuda.device_count()} CUDA device(s)")
        torch.cuda.set_device(device)
    return device


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global generators (torch's seeds every GPU's too), as ``train`` does
    before it builds the model (``train.seed``)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


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


def build_model(config: RunConfig) -> Embedder:
    """The run's ``Embedder``: ``create_model`` with the ``model`` section, channels-last as
    ``train.channels_last`` says."""
    m = config.model
    model = create_model(backbone=m.backbone, head=m.head, embedding_dim=m.embedding_dim, pretrained=m.pretrained,
                         split=m.split, freeze_bn=m.freeze_bn, weights=m.weights, trust_pickle=m.trust_pickle,
                         **m.head_options)
    return model.set_channels_last(config.train.channels_last)


def untrained_baseline(config: RunConfig, table: RetrievalTable, device: torch.device,
                       progress: bool, split: str = "test") -> dict[str, Any]:
    """Metrics of the backbone's l2-normalised pooled features on ``split``, before any training. The backbone is built
    from the run's seed, as ``build_model`` builds it after ``seed_everything``: a randomly initialised backbone is
    the run's own untrained one (it was whatever the random stream held when the baseline was evaluated)."""
    m = config.model
    with torch.random.fork_rng():  # the run's random streams (CPU and GPU) are left as they were
        torch.manual_seed(config.train.seed)
        model = create_model(backbone=m.backbone, head="gap", embedding_dim=0, pretrained=m.pretrained,
                             freeze_bn=m.freeze_bn, weights=m.weights, trust_pickle=m.trust_pickle)
    model = model.set_channels_last(config.train.channels_last).to(device)
    test = split == "test"  # validation: what checkpoints are selected by (Recall@1, MAP@R, R-precision)
    metrics = evaluate(model, table, split, EmbedSettings.from_config(config, device, progress),
                       config.eval.recall_at if test else (1,), config.eval.nmi and test, config.eval.engine)
    pretrained = "ImageNet-pretrained" if m.pretrained else "randomly initialised"
    return {"model": f"{pretrained} {m.backbone}, pooled features, no training", "metrics": metrics,
            "environment": evaluation_environment(device, config.eval.engine)}
