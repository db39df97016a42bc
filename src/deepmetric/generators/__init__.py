"""Example generators: components that add synthetic (embedding, label) rows to every training batch.

A generator plugs into the trainer the way a regulariser plugs into the objective: the trainer calls it
generically and never asks which one it has. Per step::

    output = model(images)                               # real examples (HeadOutput)
    batch  = generator.generate(output, labels)          # GeneratedBatch or None
    loss, terms = objective(output, labels, generated=batch.rows())   # the metric loss sees both
    loss.backward(); optimizer.step()                    # backbone + head (+ objective)
    terms |= generator.step(output, labels)              # the generator's own updates and loss terms

A generator owns its parameters and optimisers (the trainer's Adam never sees them), and its
``checkpoint_state`` / ``load_checkpoint_state`` hold everything needed for an exact ``--resume``
(tensors for safetensors, the rest as JSON). ``write_diagnostics`` draws what the method wants to show,
into the run directory, at the end of training. Register a class with ``register_generator``; it is
built with the options of ``generator.options`` and, when its constructor asks for them, ``head``,
``num_classes`` (training classes), ``batch_size`` (real images per batch), ``lr`` (``train.lr``) and
``seed`` (``train.seed``).
"""

from __future__ import annotations

import inspect
from typing import Any

from ..errors import ConfigError, did_you_mean
from .base import GeneratedBatch, Generator
from .mirage import MirageGenerator

PROVIDED = ("head", "num_classes", "batch_size", "lr", "seed")


GENERATORS: dict[str, type[Generator]] = {}


def register_generator(name: str, cls: type[Generator]) -> type[Generator]:
    GENERATORS[name] = cls
    return cls


def _accepted(name: str) -> tuple[type[Generator], list[str]]:
    if name not in GENERATORS:
        known = ", ".join(GENERATORS) or "none registered"
        raise ConfigError(f"unknown generator '{name}'{did_you_mean(name, GENERATORS)}; known: {known}")
    cls = GENERATORS[name]
    return cls, [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", *PROVIDED)]


def check_generator_options(name: str, options: dict[str, Any]) -> None:
    """Unknown generator names and options are named, with the valid ones (config validation)."""
    _, accepted = _accepted(name)
    for key in options or {}:
        if key not in accepted:
            raise ConfigError(f"generator '{name}' has no option '{key}'{did_you_mean(key, accepted)}; its options "
                              f"are: {', '.join(accepted)}")


def build_generator(name: str, options: dict[str, Any], **provided: Any) -> Generator:
    """Build generator ``name`` with ``options`` plus the provided values its constructor asks for."""
    check_generator_options(name, options)
    cls, _ = _accepted(name)
    parameters = inspect.signature(cls.__init__).parameters
    return cls(**dict(options or {}), **{k: v for k, v in provided.items() if k in parameters})


register_generator("mirage", MirageGenerator)

__all__ = ["GENERATORS", "GeneratedBatch", "Generator", "MirageGenerator", "build_generator",
           "check_generator_options", "register_generator"]
