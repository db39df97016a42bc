"""Regularisers: ``reg(output: HeadOutput, labels) -> scalar``, added to the objective by name.

Each regulariser registers itself at its class in ``REGULARIZERS`` (``registry.py``). A regulariser is built
with the options of ``loss.regularizers.<name>`` (all but ``weight``) and, when its constructor asks for
them, ``head`` (the model's head), ``num_classes`` (training classes) and ``metric_loss`` (a function
returning a new copy of the run's metric loss, for regularisers that put the metric loss on embeddings of
their own, e.g. HORDE's per-order embeddings).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from .registry import REGULARIZERS

register_regularizer = REGULARIZERS.register
check_regularizer_options = REGULARIZERS.check
"""The class of regulariser ``name`` once every option is known (config validation)."""

DEFAULT_WEIGHT = 1.0
"""A regulariser's ``weight`` in the objective when its options give none."""


def regularizer_options(name: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """``options`` with every option left out at its default (``weight`` and the constructor's): what regulariser
    ``name`` trains with. Two configs that differ only in writing a default out train alike."""
    return {"weight": DEFAULT_WEIGHT, **REGULARIZERS.defaults(name), **(options or {})}


def build_regularizer(name: str, options: dict[str, Any], head: nn.Module | None = None,
                      num_classes: int | None = None,
                      metric_loss: Callable[[], nn.Module] | None = None) -> tuple[nn.Module, float]:
    """``(module, weight)`` for ``loss.regularizers.<name>``; unknown names and options are named."""
    module = REGULARIZERS.build(name, options, head=head, num_classes=num_classes, metric_loss=metric_loss)
    return module, float((options or {}).get("weight", DEFAULT_WEIGHT))
