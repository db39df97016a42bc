"""``train.compile``: the training forward pass through ``torch.compile``, falling back to eager in one line.

Only the training step's forward (and so its backward) is compiled: ``torch.compile`` wraps the module (or its
``DistributedDataParallel`` wrapper) in a new callable that shares its parameters, so the checkpoint, resume,
validation, evaluation and export all see the plain module, its state-dict keys unchanged. The objective is not
compiled: the metric losses build their pair masks from the labels of each batch (data-dependent shapes), where
dynamo breaks the graph at every mask and gains nothing. Under ``train.amp`` the compiled forward is traced under the
autocast around it (bf16 or fp16); fp16's gradient scaler acts on the loss and the optimiser, outside the graph
(``tests/test_compile.py``: an fp16 compiled run skips the eager run's steps and has its losses).

A model that cannot be compiled fails at its first call: the step is then taken eagerly, with one warning naming the
reason, and every later step too (``models/compiled.py``, which the embedding pass's ``eval.compile`` shares).
Compiling costs a minute or more on a CPU (Lite0's forward and backward: 45 s on 2 idle cores, 343 s on 2 loaded ones),
and there the compiled step is slower (0.54-0.59 of eager for GAP, ABE, DIABLO, DGML and DeML at 64 px) with the same
loss curve up to rounding; the gain is a GPU's, so it is off unless asked for (``docs/benchmarks/training-step.md``).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..models.compiled import CompiledForward


def training_forward(module: nn.Module, compile_model: bool) -> Any:
    """What the training step calls for its forward pass: ``module`` itself, or with ``compile_model`` a
    ``CompiledForward`` of it."""
    return CompiledForward(module) if compile_model else module
