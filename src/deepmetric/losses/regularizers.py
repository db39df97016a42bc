"""Registry of regularisers: ``reg(output: HeadOutput, labels) -> scalar``, added to the objective by name.

Every regulariser is registered here, in one table (a new method adds its line). A regulariser is built
with the options of ``loss.regularizers.<name>`` (all but ``weight``) and, when its constructor asks for
them, ``head`` (the model's head), ``num_classes`` (training classes) and ``metric_loss`` (a function
returning a new copy of the run's metric loss, for regularisers that put the metric loss on embeddings of
their own, e.g. HORDE's per-order embeddings).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from ..registry import Registry
from .activation_decay import ActivationDecay, LearnerRowNorm
from .deml_diversity import DeMLAdversary, DeMLPairHinge
from .divergence import ABEDivergenceLoss
from .diversity import DiversityLoss
from .horde import HordeRegularizer

PROVIDED = ("head", "num_classes", "metric_loss")  # what the objective passes a regulariser, not options

REGULARIZERS: Registry[type[nn.Module]] = Registry("regularizer", provided=PROVIDED, extra_options=("weight",))
REGULARIZERS.register("horde", HordeRegularizer)  # thesis ch. 5
REGULARIZERS.register("divergence", ABEDivergenceLoss)  # ABE eq. 9
REGULARIZERS.register("diversity", DiversityLoss)  # DGML eq. 4
REGULARIZERS.register("deml-adversary", DeMLAdversary)  # DeML eq. 4
REGULARIZERS.register("deml-hinge", DeMLPairHinge)  # the DeML code's replacement of eq. 4
REGULARIZERS.register("activation-decay", ActivationDecay)  # DeML eq. 6, L_act
REGULARIZERS.register("learner-row-norm", LearnerRowNorm)  # DeML eq. 6, L_ntri

register_regularizer = REGULARIZERS.register
check_regularizer_options = REGULARIZERS.check
"""The class of regulariser ``name`` once every option is known (config validation)."""


def build_regularizer(name: str, options: dict[str, Any], head: nn.Module | None = None,
                      num_classes: int | None = None,
                      metric_loss: Callable[[], nn.Module] | None = None) -> tuple[nn.Module, float]:
    """``(module, weight)`` for ``loss.regularizers.<name>``; unknown names and options are named."""
    module = REGULARIZERS.build(name, options, head=head, num_classes=num_classes, metric_loss=metric_loss)
    return module, float((options or {}).get("weight", 1.0))
