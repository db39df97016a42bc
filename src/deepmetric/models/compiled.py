"""A module's forward pass through ``torch.compile``, falling back to eager in one warning: what ``train.compile``
(the training step's forward, ``training/compiled.py``) and ``eval.compile`` (every embedding pass,
``models/inference.py``) call.

``torch.compile`` wraps the module in a new callable that shares its parameters, so checkpoints, resume and export
see the plain module, its state-dict keys unchanged. A model that cannot be compiled (an operation dynamo does not
support, a backend that fails, no C++ compiler for inductor on a CPU) fails at its first call: that call and every
later one then run eagerly, after one warning naming the option and the reason. The failure is remembered for that
module and option, so a later ``CompiledForward`` of them (each validation pass under ``eval.compile`` makes one) runs
eagerly at once, without compiling and failing again, or warning again.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

import torch
from torch import nn

log = logging.getLogger("deepmetric")

BACKEND = "inductor"
"""The ``torch.compile`` backend (tests use ``aot_eager``, which traces the same graphs without generating code)."""

_FAILED: weakref.WeakKeyDictionary[nn.Module, set[str]] = weakref.WeakKeyDictionary()
"""The options under which each module (held weakly) failed to compile in this process."""


class CompiledForward:
    """Calls ``torch.compile(module)``; when compiling fails, warns once (naming ``option``, the setting that asked for
    it, and what runs instead: ``then``) and calls ``module`` from then on."""

    def __init__(self, module: nn.Module, option: str = "train.compile", then: str = "training eagerly"):
        self.module = module
        self.option = option
        self.then = then
        self.compiled: Any = None if option in _FAILED.get(module, ()) else torch.compile(module, backend=BACKEND)

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
            if not is_compile_error(failure):
                raise
            reason = " ".join(str(failure).split())[:300]
            log.warning("%s: the model cannot be compiled (%s: %s); %s", self.option, type(failure).__name__, reason,
                        self.then)
            self.compiled = None
            _FAILED.setdefault(self.module, set()).add(self.option)
            return self.module(*args, **kwargs)


def is_compile_error(failure: Exception) -> bool:
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
