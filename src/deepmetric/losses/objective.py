"""``Objective``: the metric loss (on the embedding or on each learner's part) plus weighted regularisers.

The metric loss is ``loss(embeddings, labels) -> scalar``; a regulariser is
``reg(output: HeadOutput, labels) -> scalar``. The trainer calls ``objective(output, labels)`` and never
looks at which head, loss or regulariser it has. Each term is returned unweighted, for the logs.

A regulariser that computes embeddings of its own (HORDE's per-order embeddings) may expose them with
``embeddings(output) -> {name: (B, D)}``; ``Objective.auxiliary_embeddings`` collects them for
evaluation-side uses (per-order retrieval, concatenation + PCA) without knowing the regulariser.

An example generator (``deepmetric.generators``, e.g. MIRAGE) may pass ``generated=(embeddings, labels)``:
extra rows appended to the batch of the *metric* loss only (regularisers see the real examples' output).
With ``on="parts"`` each generated row is cut into the parts' widths and each piece l2-normalised.

A cross-batch memory (``memory.py``, ``loss.memory``) adds the term ``weight * L(batch -> memory)``, logged as
``memory``: each metric loss pairs the batch's rows (the embedding, or its learner's part) with the memory's, reduced
over the parts as the batch term is; the batch is then enqueued (in training mode only).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from ..models.heads import HeadOutput
from .memory import CrossBatchMemory


class Objective(nn.Module):
    """``total = reduce_p L(part_p) + sum_r w_r R_r(output)`` (or ``L(embedding)`` with ``on="embedding"``).

    ``metric_losses`` holds one loss per part when ``on="parts"`` (so per-part parameters, such as the
    margin loss' boundaries per group, stay separate) or a single loss for the embedding. ``memory``, a
    ``CrossBatchMemory``, adds ``memory.weight * L(batch -> memory)`` (Wang et al. 2020) once its warm-up is over.
    """

    def __init__(self, metric_losses: list[nn.Module] | nn.Module, on: str = "embedding",
                 parts_reduction: str = "mean", regularizers: dict[str, tuple[nn.Module, float]] | None = None,
                 num_classes: int | None = None, memory: CrossBatchMemory | None = None):
        super().__init__()
        self.memory = memory
        self.num_classes = num_classes  # the classes its per-class parameters (if any) are sized for
        if isinstance(metric_losses, nn.Module):
            metric_losses = [metric_losses]
        if on not in ("embedding", "parts") or parts_reduction not in ("mean", "sum"):
            raise ConfigError(f"objective: on={on!r}, parts_reduction={parts_reduction!r} is not supported")
        self.metric_losses = nn.ModuleList(metric_losses)
        self.on, self.parts_reduction = on, parts_reduction
        self.regularizers = nn.ModuleDict({name: module for name, (module, _) in (regularizers or {}).items()})
        self.weights = {name: float(weight) for name, (_, weight) in (regularizers or {}).items()}

    def metric(self, output: HeadOutput, labels: torch.Tensor,
               generated: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        if generated is not None:
            extra, extra_labels = generated
            labels = torch.cat([labels, extra_labels])
        if self.on == "embedding":
            embedding = output.embedding if generated is None else torch.cat([output.embedding, extra])
            return self.metric_losses[0](embedding, labels)
        parts = self._rows(output)
        if generated is not None:
            pieces = torch.split(extra, [p.shape[1] for p in parts], dim=1)
            parts = [torch.cat([p, F.normalize(q, dim=1)]) for p, q in zip(parts, pieces, strict=True)]
        return self._reduce([self._loss(i)(part, labels) for i, part in enumerate(parts)])

    def _rows(self, output: HeadOutput) -> list[torch.Tensor]:
        """What the metric losses see: ``[embedding]``, or every learner's part."""
        if self.on == "embedding":
            return [output.embedding]
        if len(self.metric_losses) not in (1, len(output.parts)):
            raise ConfigError(f"objective has {len(self.metric_losses)} metric losses for {len(output.parts)} parts")
        return list(output.parts)

    def _loss(self, index: int) -> nn.Module:
        return self.metric_losses[index if len(self.metric_losses) > 1 else 0]

    def _reduce(self, losses: list[torch.Tensor]) -> torch.Tensor:
        if len(losses) == 1:
            return losses[0]
        total = torch.stack(losses).sum()
        return total / len(losses) if self.parts_reduction == "mean" else total

    def memory_term(self, output: HeadOutput, labels: torch.Tensor) -> torch.Tensor:
        """``L(batch -> memory)``, unweighted: each metric loss with the batch's rows as queries and the memory's as
        references (0 during the warm-up and while the memory is empty); then, in training mode, the batch's rows are
        enqueued (the parts side by side)."""
        memory = self.memory
        rows = self._rows(output)
        value = rows[0].new_zeros(())
        if memory is None or not memory.started:
            return value
        if memory.count:
            stored, stored_labels = memory.stored()
            widths = [r.shape[1] for r in rows]
            if stored.shape[1] != sum(widths):
                raise ValueError(f"the cross-batch memory holds rows of width {stored.shape[1]}; the metric losses see "
                                 f"{'+'.join(map(str, widths))}")
            references = torch.split(stored, widths, dim=1)
            value = self._reduce([self._loss(i)(row, labels, reference, stored_labels)
                                  for i, (row, reference) in enumerate(zip(rows, references, strict=True))])
        if self.training:
            memory.enqueue(torch.cat(rows, dim=1), labels)
        return value

    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
        """What ``last`` keeps beyond the ``state_dict``: the cross-batch memory's tensors and counters (``({},
        None)`` without a memory)."""
        return self.memory.checkpoint_state() if self.memory is not None else ({}, None)

    def load_checkpoint_state(self, tensors: dict[str, torch.Tensor], state: dict[str, Any] | None) -> None:
        """Restore ``checkpoint_state``'s output (nothing to do without a memory)."""
        if self.memory is not None:
            self.memory.load_checkpoint_state(tensors, state)

    def auxiliary_embeddings(self, output: HeadOutput) -> dict[str, torch.Tensor]:
        """``{"<regulariser>.<name>": (B, D)}`` from every regulariser that exposes ``embeddings``."""
        found = {}
        for reg_name, regularizer in self.regularizers.items():
            embeddings = getattr(regularizer, "embeddings", None)
            if callable(embeddings):
                found.update({f"{reg_name}.{k}": v for k, v in embeddings(output).items()})
        return found

    def set_step(self, step: int) -> None:
        """Tell every term that follows a schedule (``set_step(step)``, e.g. DeML's gradient-reversal ramp) the
        0-based training step about to be taken."""
        for module in self.modules():
            set_step = getattr(module, "set_step", None)
            if module is not self and callable(set_step):
                set_step(step)

    def forward(self, output: HeadOutput, labels: torch.Tensor,
                generated: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Return the total loss and its terms (unweighted), e.g. ``{"metric": ..., "divergence": ...}`` (and
        ``"memory"`` with a cross-batch memory)."""
        terms = {"metric": self.metric(output, labels, generated)}
        total = terms["metric"]
        if self.memory is not None:
            terms["memory"] = self.memory_term(output, labels)
            total = total + self.memory.weight * terms["memory"]
        for name, regularizer in self.regularizers.items():
            terms[name] = regularizer(output, labels)
            total = total + self.weights[name] * terms[name]
        return total, terms
