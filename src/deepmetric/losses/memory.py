"""Cross-batch memory (XBM; Wang, Zhang, Huang & Scott, "Cross-Batch Memory for Embedding Learning", CVPR 2020).

A FIFO queue of the last ``size`` embeddings (detached) and their labels. The embeddings of a trained network drift
slowly once it has settled ("slow drift", §3 of the paper), so the embeddings of earlier batches stand in for what
the current network would compute, and each step's metric loss gains pairs between the batch and the memory:

``L = L(batch, batch) + weight * L(batch -> memory)``  (the paper's Algorithm 1 and its code, weight 1)

where ``L(batch -> memory)`` is the run's own metric loss with the batch's rows as queries (anchors, with gradient)
and the memory's rows as the reference set (no gradient). The memory starts after ``warmup_steps`` (the paper: 1,000
iterations on SOP, while the features still drift fast): before that step nothing is enqueued and the term is 0.

Decisions where the paper's code and pytorch-metric-learning's ``CrossBatchMemory`` differ:

- **Enqueued after the term is computed.** The authors' code enqueues the batch first and then drops every pair of
  similarity >= 1 - 1e-5 as a self-pair (genuine near-duplicates too); PML enqueues first and removes the batch's own
  slots. Here the memory term of step t sees the batches of the steps before t only, so a query never meets its own
  copy and nothing needs removing; the batch's pairs among themselves are the batch term's. At the first step after
  the warm-up the memory is empty and the term is 0.
- **A true ring buffer**: when a batch crosses the end of the queue it wraps to the start (the authors' code
  overwrites the queue's last rows instead).
- **What the memory holds is what each metric loss sees**: the embedding, or with ``loss.on: parts`` every learner's
  part (stored side by side in one row, cut back into parts for each learner's loss). Generated rows
  (``generator.name``) and the regularisers' own embeddings (HORDE's orders) are not enqueued.
- **Distributed training**: the objective sees the batch gathered from every rank (``distributed.gather_output``), so
  every rank enqueues the same global batch and holds the same memory.
- **Resume**: the memory's rows, labels and counters are saved in the ``last`` checkpoint (``checkpoint_state``), so
  a resumed run goes on exactly as an uninterrupted one. The ``best`` checkpoint does not hold them (evaluation needs
  no memory).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError, ConfigError

PAPER_WARMUP_STEPS = 1000
"""The paper's start of the memory on SOP (its code's ``XBM.START_ITERATION``)."""


class CrossBatchMemory(nn.Module):
    """A FIFO queue of the last ``size`` rows and labels, used from step ``warmup_steps`` (0-based) on.

    The queue is a ring buffer of ``size`` slots, allocated at the first ``enqueue`` with the rows' width, device and
    dtype; ``count`` slots are filled and ``position`` is the next slot written. The trainer tells the step through
    ``Objective.set_step``. Its tensors are buffers outside the ``state_dict`` (a ``best`` checkpoint holds none);
    ``checkpoint_state`` and ``load_checkpoint_state`` carry them in ``last``.
    """

    rows: torch.Tensor  # buffers (register_buffer)
    labels: torch.Tensor

    def __init__(self, size: int, warmup_steps: int = PAPER_WARMUP_STEPS, weight: float = 1.0):
        super().__init__()
        if int(size) < 1 or int(warmup_steps) < 0 or not float(weight) >= 0:
            raise ConfigError(f"cross-batch memory: size must be >= 1, warmup_steps >= 0 and weight >= 0; got size="
                              f"{size}, warmup_steps={warmup_steps}, weight={weight}")
        self.size, self.warmup_steps, self.weight = int(size), int(warmup_steps), float(weight)
        self.register_buffer("rows", torch.zeros(0, 0), persistent=False)  # (size, D) once allocated
        self.register_buffer("labels", torch.zeros(0, dtype=torch.long), persistent=False)  # (size,)
        self.count, self.position, self.step = 0, 0, 0

    def extra_repr(self) -> str:
        return f"size={self.size}, warmup_steps={self.warmup_steps}, weight={self.weight}, count={self.count}"

    def set_step(self, step: int) -> None:
        """The 0-based training step about to be taken (``Objective.set_step``)."""
        self.step = int(step)

    @property
    def started(self) -> bool:
        """Whether the warm-up is over: the memory term is computed and batches are enqueued."""
        return self.step >= self.warmup_steps

    def stored(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A copy of the filled slots, in slot order: rows (count, D) and labels (count,)."""
        return self.rows[:self.count].clone(), self.labels[:self.count].clone()

    def ordered(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows and labels held, oldest first."""
        rows, labels = self.stored()
        if self.count < self.size:
            return rows, labels
        return torch.roll(rows, -self.position, dims=0), torch.roll(labels, -self.position, dims=0)

    @torch.no_grad()
    def enqueue(self, rows: torch.Tensor, labels: torch.Tensor) -> None:
        """Append ``rows`` (B, D) and ``labels`` (B,), detached, dropping the oldest rows beyond ``size``."""
        rows, labels = rows.detach(), labels.detach().to(torch.long)
        if len(rows) > self.size:
            rows, labels = rows[-self.size:], labels[-self.size:]
        if self.rows.numel() == 0:
            self.rows = torch.zeros(self.size, rows.shape[1], dtype=rows.dtype, device=rows.device)
            self.labels = torch.zeros(self.size, dtype=torch.long, device=rows.device)
        elif rows.shape[1] != self.rows.shape[1]:
            raise ValueError(f"cross-batch memory: rows of width {rows.shape[1]} for a memory of width "
                             f"{self.rows.shape[1]}")
        slots = (self.position + torch.arange(len(rows), device=self.rows.device)) % self.size
        self.rows[slots] = rows.to(self.rows.dtype)
        self.labels[slots] = labels.to(self.labels.device)
        self.position = (self.position + len(rows)) % self.size
        self.count = min(self.count + len(rows), self.size)

    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """``(tensors, state)``: the filled slots' rows and labels, and the counters as JSON."""
        state = {"size": self.size, "count": self.count, "position": self.position}
        if self.count == 0:
            return {}, state
        return {"rows": self.rows[:self.count], "labels": self.labels[:self.count]}, state

    def load_checkpoint_state(self, tensors: dict[str, torch.Tensor], state: dict[str, Any] | None) -> None:
        """Restore what ``checkpoint_state`` returned; a checkpoint without it, or of another size, is refused."""
        if not isinstance(state, dict) or state.get("size") != self.size:
            held = "none" if not isinstance(state, dict) else f"one of size {state.get('size')}"
            raise CheckpointError(f"the checkpoint holds {held} for a cross-batch memory of size {self.size} "
                                  "(loss.memory.size)")
        count, position = int(state["count"]), int(state["position"])
        if not 0 <= position < self.size or not 0 <= count <= self.size or (count < self.size and position != count):
            raise CheckpointError(f"the checkpoint's cross-batch memory counters are inconsistent: {state}")
        device = self.labels.device
        if count == 0:
            self.rows, self.labels = torch.zeros(0, 0, device=device), torch.zeros(0, dtype=torch.long, device=device)
        else:
            rows, labels = tensors.get("rows"), tensors.get("labels")
            if rows is None or labels is None or rows.dim() != 2 or len(rows) != count or len(labels) != count:
                raise CheckpointError(f"the checkpoint's cross-batch memory tensors do not hold its {count} rows")
            self.rows = torch.zeros(self.size, rows.shape[1], dtype=rows.dtype, device=device)
            self.labels = torch.zeros(self.size, dtype=torch.long, device=device)
            self.rows[:count], self.labels[:count] = rows.to(device), labels.to(device=device, dtype=torch.long)
        self.count, self.position = count, position
