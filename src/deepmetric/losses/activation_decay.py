"""DeML's activation decay and its anti-trivial weight term (Chen & Deng 2019, eq. 6).

- ``activation-decay``: ``L_act = 1/(2 I J N) sum_{i,j,n} ||CA_(i,j)[x_n^i]||^2`` on the learners' raw outputs
  (lambda_1 = 0.014 as the weight). ``reach_backbone=True`` (the paper's implied reading) lets the gradient reach
  the learners, the backbone copies and the gates; ``False`` is the released code's path: the learner weights
  only (their outputs recomputed from detached inputs). The code also sums per scale over branch 1 only and
  divides by the output size instead of 2 I J; the paper's normalisation is used here.
- ``learner-row-norm``: ``L_ntri = sum_{i,j} tr[(omega_ij omega_ij^T - I) ⊙ (omega_ij omega_ij^T - I)]``
  (lambda_2 = 0.25 as the weight). The trace of a Hadamard square keeps the diagonal only, so
  ``L_ntri = sum_{i,j} sum_r (||omega_r||^2 - 1)^2``: rows of unit norm, which stops L_act from shrinking the
  weights to 0. (The code adds the same gradient with lambda 0.5 / 56 per row.)

Both read what the head puts in ``HeadOutput.extras`` (the deml head provides them, and the gap head for its
single learner, DeML's ``Ud + L_act`` baselines).
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ConfigError
from ..models.heads import HeadOutput
from .registry import REGULARIZERS


def _extra(output: HeadOutput, key: str, regularizer: str) -> torch.Tensor:
    if key not in output.extras:
        raise ConfigError(f"regularizer '{regularizer}' needs extras['{key}'] from the head (the deml head and "
                          f"the gap head with a projection give it); this head's extras are: "
                          f"{', '.join(output.extras) or 'none'}")
    return output.extras[key]


@REGULARIZERS.register("activation-decay")  # DeML eq. 6, L_act
class ActivationDecay(nn.Module):
    def __init__(self, reach_backbone: bool = True):
        super().__init__()
        self.key = "learner_activations" if reach_backbone else "learner_activations_fc_only"

    def forward(self, output: HeadOutput, labels: torch.Tensor) -> torch.Tensor:
        activations = _extra(output, self.key, "activation-decay")  # (B, I·J, d')
        return activations.pow(2).sum(dim=2).mean() / 2


@REGULARIZERS.register("learner-row-norm")  # DeML eq. 6, L_ntri
class LearnerRowNorm(nn.Module):
    def forward(self, output: HeadOutput, labels: torch.Tensor) -> torch.Tensor:
        weights = _extra(output, "learner_weights", "learner-row-norm")  # (L, d', C)
        return (weights.pow(2).sum(dim=2) - 1).pow(2).sum()
