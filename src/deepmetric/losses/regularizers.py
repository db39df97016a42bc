"""Registry of regularisers: ``reg(output: HeadOutput, labels) -> scalar``, added to the objective by name.

A method registers its regulariser class here (e.g. ABE's divergence loss, DGML's diversity loss); the
class is built with the options of ``loss.regularizers.<name>`` (all but ``weight``) and, when its
constructor asks for them, ``head`` (the model's head), ``num_classes`` (training classes) and
``metric_loss`` (a function returning a new copy of the run's metric loss, for regularisers that put
the metric loss on embeddings of their own, e.g. HORDE's per-order embeddings).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from torch import nn

from ..errors import ConfigError, did_you_mean

REGULARIZERS: dict[str, type[nn.Module]] = {}


def register_regularizer(name: str, cls: type[nn.Module]) -> type[nn.Module]:
    REGULARIZERS[name] = cls
    return cls


PROVIDED = ("head", "num_classes", "metric_loss")  # what the objective passes a regulariser, not options


def check_regularizer_options(name: str, options: dict[str, Any] | None) -> type[nn.Module]:
    """The class of regulariser ``name``; an unknown name or option is named with the valid ones."""
    if name not in REGULARIZERS:
        known = ", ".join(REGULARIZERS) or "none registered"
        raise ConfigError(f"unknown regularizer '{name}'{did_you_mean(name, REGULARIZERS)}; known: {known}")
    cls = REGULARIZERS[name]
    accepted = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", *PROVIDED)]
    for key in options or {}:
        if key != "weight" and key not in accepted:
            raise ConfigError(f"regularizer '{name}' has no option '{key}'{did_you_mean(key, accepted)}; its "
                              f"options are: weight, {', '.join(accepted) or '(none)'}")
    return cls


def build_regularizer(name: str, options: dict[str, Any], head: nn.Module | None = None,
                      num_classes: int | None = None,
                      metric_loss: Callable[[], nn.Module] | None = None) -> tuple[nn.Module, float]:
    """``(module, weight)`` for ``loss.regularizers.<name>``; unknown names and options are named."""
    cls = check_regularizer_options(name, options)
    options = dict(options or {})
    weight = float(options.pop("weight", 1.0))
    parameters = inspect.signature(cls.__init__).parameters
    provided = {"head": head, "num_classes": num_classes, "metric_loss": metric_loss}
    options.update({k: v for k, v in provided.items() if k in parameters})
    return cls(**options), weight
