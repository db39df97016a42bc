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
into the run directory, at the end of training. Register a class with ``@GENERATORS.register(name)`` at the class
(``register_generator``); it is
built with the options of ``generator.options`` and, when its constructor asks for them, ``head``,
``num_classes`` (training classes), ``batch_size`` (real images per batch), ``lr`` (``train.lr``) and
``seed`` (``train.seed``).
"""

from __future__ import annotations

from .base import GeneratedBatch, Generator
from .mirage import MirageGenerator, MirageOptions
from .registry import GENERATORS

register_generator = GENERATORS.register
check_generator_options = GENERATORS.check
"""Unknown generator names and options are named, with the valid ones (config validation)."""
build_generator = GENERATORS.build
"""``build_generator(name, options, **provided)``: the generator with ``options`` plus the provided values
(``head``, ``num_classes``, ``batch_size``, ``lr``, ``seed``) its constructor asks for."""

__all__ = ["GENERATORS", "GeneratedBatch", "Generator", "MirageGenerator", "MirageOptions", "build_generator",
           "check_generator_options", "register_generator"]
