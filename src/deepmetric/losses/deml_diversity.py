"""DeML's diversity constraint on the J learners of each scale (Chen & Deng 2019, §3.2), in both published forms.

``deml-adversary`` (the paper, eq. 4; lambda_0 = 1 as the weight):
``max_{f, g, CAMs} min_{F^i} L_adv = sum_{j,j'} ||F^i(CA_(i,j)[x^i]) - F^i(CA_(i,j')[x^i])||^2``, one adversary F^i per
scale behind a gradient-reversal layer: F^i descends L_adv, the learners, gates and backbone descend -lambda L_adv.
The paper is silent on lambda; as the authors' code, it ramps from 0 to ``reversal`` with Ganin's schedule over
``ramp_steps`` = 10,000 training steps (``ganin_lambda``: 0.05 at step 100, 0.64 at 1,500), so that the learners
are not pushed apart before the adversary has learnt anything; ``ramp_steps=0`` reverses with ``reversal`` from
the first step (this project's behaviour before 2026-11-26). The trainer tells the objective the step
(``Objective.set_step``).
The paper leaves F unspecified, and min_F of a pure discrepancy is solved by a constant F, after which the
constraint does nothing. Here F^i is an MLP (d' -> 256 -> LeakyReLU(0.2) -> 128) whose outputs are
**standardised over the batch** (zero mean, unit variance per output unit over the B x J learner outputs of the
scale, no learned affine; the variance floor is relative, so the standardisation is exactly scale-invariant):
shrinking F towards a constant neither lowers L_adv nor gets a gradient. F can only lower L_adv by finding
features in which the J learners of one image agree while images still differ, and the reversed gradient
makes the learners disagree exactly there. (A leaky ReLU has no dead units, so F cannot switch itself off.)
It reads the l2-normalised learner outputs (the representation the metric and retrieval use).
Normalisation (unspecified in the paper): the mean over images, scales and unordered pairs j < j' of
``||.||^2 / 128``, so independent learners give about 2 whatever B, I, J.

``deml-hinge`` (the released code's replacement, weight 0.2 per pair): for every scale and unordered pair j < j',
``(1/2B) sum_n max(0, m - ||z_(i,j,n) - z_(i,j',n)||)^2`` on the l2-normalised outputs, m = 2 (Caffe's
contrastive loss with every pair labelled dissimilar), summed over pairs and scales. It is zero only for
antipodal learners.
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from ..models.heads import HeadOutput
from .gradient_reversal import ganin_lambda, reverse_gradient
from .registry import REGULARIZERS


@runtime_checkable
class DecoupledLearners(Protocol):
    """A head with I x J decoupled learners of d' dimensions (the deml head)."""

    num_scales: int
    num_branches: int
    part_dim: int


def learner_grid(head: nn.Module | None, regularizer: str) -> tuple[int, int, int]:
    """(I, J, d') of a head with decoupled learners (the deml head)."""
    if not isinstance(head, DecoupledLearners):  # has the three attributes
        raise ConfigError(f"regularizer '{regularizer}' needs a head with I x J decoupled learners (the deml head); "
                          f"got {type(head).__name__}")
    return head.num_scales, head.num_branches, head.part_dim


def grouped_parts(output: HeadOutput, num_scales: int, num_branches: int) -> torch.Tensor:
    """The per-learner l2-normalised outputs as (B, I, J, d') (parts are scale-major)."""
    if len(output.parts) != num_scales * num_branches:
        raise ConfigError(f"expected {num_scales} x {num_branches} learner outputs, the head gave {len(output.parts)}")
    parts = torch.stack(output.parts, dim=1)
    return parts.view(parts.shape[0], num_scales, num_branches, -1)


@REGULARIZERS.register("deml-adversary")  # DeML eq. 4
class DeMLAdversary(nn.Module):
    def __init__(self, head: nn.Module | None = None, hidden_dim: int = 256, output_dim: int = 128,
                 reversal: float = 1.0, eps: float = 1e-5, ramp_steps: int = 10_000):
        super().__init__()
        self.num_scales, self.num_branches, part_dim = learner_grid(head, "deml-adversary")
        if ramp_steps < 0:
            raise ConfigError(f"regularizer 'deml-adversary': ramp_steps must be at least 0, got {ramp_steps}")
        self.reversal, self.eps, self.ramp_steps = reversal, eps, ramp_steps
        self.step = 0  # the training step, from Objective.set_step
        if self.num_branches < 2:  # no pair of learners to compare: nothing to learn
            return
        i = self.num_scales
        self.w1 = nn.Parameter(torch.empty(i, part_dim, hidden_dim))
        self.b1 = nn.Parameter(torch.zeros(i, hidden_dim))
        self.w2 = nn.Parameter(torch.empty(i, hidden_dim, output_dim))
        for weight, fan_in in ((self.w1, part_dim), (self.w2, hidden_dim)):
            nn.init.uniform_(weight, -1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in))  # nn.Linear's default

    def set_step(self, step: int) -> None:
        self.step = step

    def reversal_now(self) -> float:
        """lambda at the current step: ``reversal`` x Ganin's ramp over ``ramp_steps``."""
        return self.reversal * ganin_lambda(self.step, self.ramp_steps)

    def adversary(self, parts: torch.Tensor) -> torch.Tensor:
        """F^i of every learner output (B, I, J, d') -> standardised features (B, I, J, k)."""
        hidden = F.leaky_relu(torch.einsum("bijd,idh->bijh", parts, self.w1) + self.b1[:, None], 0.2)
        features = torch.einsum("bijh,iho->bijo", hidden, self.w2)
        mean = features.mean(dim=(0, 2), keepdim=True)
        var = features.var(dim=(0, 2), unbiased=False, keepdim=True)  # (1, I, 1, k)
        floor = self.eps * var.mean(dim=3, keepdim=True) + torch.finfo(var.dtype).tiny  # relative to F's scale
        return (features - mean) / torch.sqrt(var + floor)

    def forward(self, output: HeadOutput, labels: torch.Tensor) -> torch.Tensor:
        parts = grouped_parts(output, self.num_scales, self.num_branches)
        if self.num_branches < 2:
            return parts.new_zeros(())
        features = self.adversary(reverse_gradient(parts, self.reversal_now()))
        p, q = torch.triu_indices(self.num_branches, self.num_branches, offset=1, device=parts.device)
        return (features[:, :, p] - features[:, :, q]).pow(2).mean(dim=3).mean()


@REGULARIZERS.register("deml-hinge")  # the DeML code's replacement of eq. 4
class DeMLPairHinge(nn.Module):
    def __init__(self, head: nn.Module | None = None, margin: float = 2.0):
        super().__init__()
        self.num_scales, self.num_branches, _ = learner_grid(head, "deml-hinge")
        self.margin = margin

    def forward(self, output: HeadOutput, labels: torch.Tensor) -> torch.Tensor:
        parts = grouped_parts(output, self.num_scales, self.num_branches)
        p, q = torch.triu_indices(self.num_branches, self.num_branches, offset=1, device=parts.device)
        distance = (parts[:, :, p] - parts[:, :, q]).pow(2).sum(dim=3).clamp_min(1e-12).sqrt()  # (B, I, pairs)
        return torch.relu(self.margin - distance).pow(2).sum(dim=(1, 2)).mean() / 2
