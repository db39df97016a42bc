"""The generator contract (see ``deepmetric.generators``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..models.heads import HeadOutput
from ..registry import keyword_parameters


@dataclass
class GeneratedBatch:
    """Synthetic rows for the metric loss: ``embeddings`` (G, D) and ``labels`` (G,); the first ``examples`` rows
    are generated examples, any others are method-specific rows (MIRAGE's prototypes as proxies)."""

    embeddings: torch.Tensor
    labels: torch.Tensor
    examples: int = -1

    def __post_init__(self) -> None:
        if self.examples < 0:
            self.examples = len(self.labels)

    def rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.embeddings, self.labels


PROVIDED = ("head", "num_classes", "batch_size", "lr", "seed")
"""What the trainer passes a generator's constructor (when it asks for them), not options."""


class Generator(nn.Module):
    """Base class of example generators (see the module docstring for the protocol)."""

    @classmethod
    def option_names(cls) -> list[str]:
        """The generator's options (``generator.options``): its constructor's keywords, less what is provided."""
        return [name for name in keyword_parameters(cls) if name not in PROVIDED]

    extra_classes: int = 0
    """Labels the generator adds after the training classes' (``num_classes .. num_classes + extra - 1``);
    the objective is built for ``num_classes + extra_classes`` classes."""
    diagnostic_images: int = 0
    """How many training images (test transform, seeded sample) ``write_diagnostics`` wants embedded."""

    def generate(self, output: HeadOutput, labels: torch.Tensor) -> GeneratedBatch | None:
        """Synthetic rows for this batch (None: none), differentiable w.r.t. what the metric loss trains."""
        raise NotImplementedError

    def step(self, output: HeadOutput, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        """The generator's own updates after the metric step; returns its loss terms for the logs."""
        raise NotImplementedError

    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """(tensors, JSON state) that restore the generator, its optimisers and its random stream."""
        raise NotImplementedError

    def load_checkpoint_state(self, tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
        raise NotImplementedError

    def write_diagnostics(self, folder: Path, embeddings: torch.Tensor, labels: np.ndarray,
                          names: list[str] | None = None) -> dict[str, Any]:
        """Write pictures/numbers into ``folder`` from real training ``embeddings`` (N, D) with their contiguous
        ``labels`` (``names[label]`` is the class's original label); returns a JSON-able summary."""
        return {}
