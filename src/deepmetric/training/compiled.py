"""``train.compile``: the training forward pass through ``torch.compile``, falling back to eager in one line.

Only the training step's forward (and so its backward) is compiled: ``torch.compile`` wraps the module (or its
``DistributedDataParallel`` wrapper) in a new callable that shares its parameters, so the checkpoint, resume,
validation, evaluation and export all see the plain module, its state-dict keys unchanged. The objective is not
compiled: the metric losses build their pair masks from the labels of each batch (data-dependent shapes), where
dynamo breaks the graph at every mask and gains nothing. Under ``train.amp`` the compiled forward is traced under the
autocast around it (bf16 or fp16); fp16's gradient scaler acts on the loss and the optimiser, outside the graph
(``tests/test_compile.py``: an fp16 compiled run skips the eager run's steps and has its losses).

A model that cannot be compiled (an operation dynamo does not support, a backend that fails, no C++ compiler for
inductor on a CPU) fails at its first call: the step is then taken eagerly, with one warning naming the reason,
and every later step too. Compiling costs minutes on a CPU (Lite0's forward and backward: 343 s on 2 loaded cores)
for a gain measured on GPUs only, so it is off unless asked for (``docs/benchmarks/training-step.md``).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

log = logging.getLogger("deepmetric")

BACKEND = "inductor"
"""The ``torch.compile`` backend (tests use ``aot_eager``, which traces the same graphs without generating code)."""


class CompiledForward:
    """Calls ``torch.compile(module)``; when compiling fails, warns once and calls ``module`` from then on."""

    def __init__(self, module: nn.Module):
        self.module = module
        self.compiled: Any = torch.compile(module, backend=BACKEND)

    @property
    def active(self) -> bool:
        """Whether calls still go through the compiled module (False after a fallback)."""
        return self.compiled is not None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.compiled is None:
            return self.module(*args, **kwargs)
        try:
            return self.compiled(*args, **kwargs)
        except Exception as failure:  # dynamo's and the backends' errors have no common public base
            if not _is_compile_error(failure):
                raise
            reason = " ".join(str(failure).split())[:300]
            log.warning("train.compile: the model cannot be compiled (%s: %s); training eagerly",
                        type(failure).__name__, reason)
            self.compiled = None
            return self.module(*args, **kwargs)


def _is_compile_error(failure: Exception) -> bool:
    """Whether ``failure`` was raised by compiling (dynamo, AOTAutograd or a backend), not by the model's own
    code run eagerly: those errors come from ``torch._dynamo`` / ``torch._inductor`` modules."""
    dynamo_errors: tuple[type[Exception], ...]
    try:
        from torch._dynamo.exc import TorchDynamoException

        dynamo_errors = (TorchDynamoException,)
    except ImportError:  # pragma: no cover (every torch this project supports has it)
        dynamo_errors = ()
    module = type(failure).__module__
    return isinstance(failure, dynamo_errors) or module.startswith(("torch._dynamo", "torch._inductor"))


def training_forward(module: nn.Module, compile_model: bool) -> Any:
    """What the training step calls for its forward pass: ``module`` itself, or with ``compile_model`` a
    ``CompiledForward`` of it."""
    return CompiledForward(module) if compile_model else module
