"""The tables of the objective's plug-ins by name: metric losses (``LOSSES``), miners (``MINERS``) and regularisers
(``REGULARIZERS``). Each built-in registers itself at its class (``@LOSSES.register("binomial")``);
pytorch-metric-learning's losses and miners are served by the prefix ``pml:`` (``pml.py``)."""

from __future__ import annotations

from torch import nn

from ..errors import ConfigError
from ..registry import Registry

LOSSES: Registry[type[nn.Module]] = Registry("loss", provided=("num_classes", "embedding_size", "descriptors_dim"))
"""``descriptors_dim`` is PML's ``P2SGradLoss``'s name for the embedding's width."""

MINERS: Registry[type[nn.Module]] = Registry("miner", error=ConfigError)
"""Pair and triplet miners for ``loss.miner`` (pytorch-metric-learning's, ``pml:<Class>``)."""

REGULARIZER_PROVIDED = ("head", "num_classes", "metric_loss")
"""What the objective passes a regulariser, not options."""
REGULARIZERS: Registry[type[nn.Module]] = Registry("regularizer", provided=REGULARIZER_PROVIDED,
                                                   extra_options=("weight",))
