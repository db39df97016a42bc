"""``eval.amp`` and ``eval.compile``: how every embedding pass runs the model (validation and test, ``embed``,
``index``, ``search``, ``serve``, ``TrainedRun.embed``).

- ``amp``: the forward pass under autocast, ``bf16`` (bfloat16) or ``fp16`` (float16); None for float32. The
  output comes back in float32 with its embedding and parts l2-normalised again in float32: normalised in bfloat16,
  their norms were 1 only to within 0.4% (8 bits of mantissa), and every metric and index assumes unit rows.
- ``compile``: the model through ``torch.compile`` (``CompiledForward``), falling back to eager in one warning. The
  compiled callable shares the model's parameters; the model itself is left as it was, for checkpoints and export.

No gradients are kept (``torch.no_grad``); the caller puts the model in eval mode.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .compiled import CompiledForward
from .heads.base import HeadOutput

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""The autocast type of each ``eval.amp`` mode."""


class InferenceForward:
    """``model(images)`` under ``amp``'s autocast on ``device``'s type, through ``torch.compile`` when
    ``compile_model``."""

    def __init__(self, model: nn.Module, device: str | torch.device, amp: str | None = None,
                 compile_model: bool = False):
        if amp is not None and amp not in AUTOCAST_DTYPES:
            raise ValueError(f"amp must be one of {', '.join(AUTOCAST_DTYPES)} or None, got {amp!r}")
        self.model = model
        self.device_type = torch.device(device).type
        self.dtype = AUTOCAST_DTYPES.get(amp) if amp else None
        self.forward: Any = (CompiledForward(model, option="eval.compile", then="embedding eagerly")
                             if compile_model else model)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> Any:
        autocast = (torch.autocast(self.device_type, dtype=self.dtype) if self.dtype is not None
                    else contextlib.nullcontext())
        with autocast:
            output = self.forward(images)
        if self.dtype is None or not isinstance(output, HeadOutput):
            return output
        output = output.float()
        return dataclasses.replace(output, embedding=F.normalize(output.embedding, dim=-1),
                                   parts=[F.normalize(part, dim=-1) for part in output.parts])
