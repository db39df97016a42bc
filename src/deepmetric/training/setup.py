"""Building a run's pieces from its config: device, seeds, the audited data table, the model, the baseline."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from ..config import RunConfig
from ..data import load_dataset
from ..data.audit import BadItem, check_table
from ..data.table import RetrievalTable, recheck_test_counts
from ..errors import DeepMetricError
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
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def load_table(config: RunConfig, progress: bool = False,
               only_split: str | None = None) -> tuple[RetrievalTable, list[BadItem]]:
    """The run's data set with its validation split (or only ``only_split`` of it), audited
    (``data.check_images``): bad items stop the run with their list, or are left out
    (``data.skip_bad_images``) and returned."""
    d = config.data
    table = load_dataset(d.spec, seed=d.seed, check_counts=d.check_counts, val_fraction=d.val_fraction,
                         val_seed=d.val_seed, check_files=not d.check_images, skip_bad=d.skip_bad_images)
    if only_split:
        table = table.split(only_split)
    if not d.check_images:
        return table, []
    checked, bad = check_table(table, d.skip_bad_images, progress)
    if len(checked) < len(table):  # bad items left out: the test split may no longer be the protocol's
        recheck_test_counts(checked, d.check_counts)
    return checked, bad


def build_model(config: RunConfig) -> Embedder:
    m = config.model
    model = create_model(backbone=m.backbone, head=m.head, embedding_dim=m.embedding_dim, pretrained=m.pretrained,
                         split=m.split, freeze_bn=m.freeze_bn, weights=m.weights, trust_pickle=m.trust_pickle,
                         **m.head_options)
    return model.set_channels_last(config.train.channels_last)


def untrained_baseline(config: RunConfig, table: RetrievalTable, device: torch.device,
                       progress: bool) -> dict[str, Any]:
    """Test metrics of the backbone's l2-normalised pooled features, before any training. The backbone is built
    from the run's seed, as ``build_model`` builds it after ``seed_everything``: a randomly initialised backbone is
    the run's own untrained one (it was whatever the random stream held when the baseline was evaluated)."""
    m = config.model
    with torch.random.fork_rng():  # the run's random streams (CPU and GPU) are left as they were
        torch.manual_seed(config.train.seed)
        model = create_model(backbone=m.backbone, head="gap", embedding_dim=0, pretrained=m.pretrained,
                             freeze_bn=m.freeze_bn, weights=m.weights, trust_pickle=m.trust_pickle)
    model = model.set_channels_last(config.train.channels_last).to(device)
    metrics = evaluate(model, table, "test", EmbedSettings.from_config(config, device, progress), config.eval.recall_at,
                       config.eval.nmi, config.eval.engine)
    pretrained = "ImageNet-pretrained" if m.pretrained else "randomly initialised"
    return {"model": f"{pretrained} {m.backbone}, pooled features, no training", "metrics": metrics,
            "environment": evaluation_environment(device, config.eval.engine)}
