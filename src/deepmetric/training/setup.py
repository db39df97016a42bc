"""Building a run's pieces from its config: seeds, the model, the untrained baseline (the device is ``devices``, the
audited data table ``runs.table``)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from ..config import RunConfig
from ..data.table import RetrievalTable
from ..evaluation import EmbedSettings, evaluate
from ..models import Embedder, create_model
from ..provenance import evaluation_environment


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global generators (torch's seeds every GPU's too), as ``train`` does
    before it builds the model (``train.seed``)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


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
