"""DGML's diversity loss (Xu et al., eq. 4): pushes the groups of one image apart.

For every image x and every pair of groups i < j, with s = cos(f_i(x), f_j(x)):
``L_div = log(1 + exp(alpha (s - mu) beta_0))``, the negative-pair half of binomial deviance; only
cross-group pairs of the same image enter. It is 0 for a single group.

Where paper and code disagree, both are options:

- ``scale`` (beta_0). Eq. 4 reuses Table 1's beta_0 = 1; the authors' code (``criteria/diversity.py``) uses
  its binomial-deviance cost C = 25 (config ``cn``). The default is 25: Table 1 puts 25 on the positive
  pairs of the metric loss, the opposite of binomial deviance as defined (Yi et al.; Ustinova & Lempitsky)
  and as the code computes it, so its beta_0 = 1 reads as a transposition; and lambda_1 in 0.01-0.03 was
  tuned with 25. With 25 the loss is a soft hinge at s = mu (about 0 below s = 0.4); with 1 it is a weak,
  almost linear push on every pair.
- ``normalization`` over group pairs. Eq. 14 averages over the N_g = P(P-1)/2 group pairs (``pairs``);
  the code sums the pairs and divides by P - 1 (``groups_minus_one``, the default, for the same reason:
  the published lambda_1 values go with it). The two agree for P = 2; for P = 4 the code's is 2x the mean.

alpha = 2 and mu = 0.5 are the code's (the paper gives no mu). Each pair term is averaged over the
images of the batch (the code's ``neg_mask = I_n``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from ..models.heads import HeadOutput
from .registry import REGULARIZERS

NORMALIZATIONS = ("groups_minus_one", "pairs")


@REGULARIZERS.register("diversity")  # DGML eq. 4
class DiversityLoss(nn.Module):
    def __init__(self, alpha: float = 2.0, mu: float = 0.5, scale: float = 25.0,
                 normalization: str = "groups_minus_one"):
        super().__init__()
        if normalization not in NORMALIZATIONS:
            raise ConfigError(f"regularizer 'diversity': normalization must be one of {', '.join(NORMALIZATIONS)}, "
                              f"got '{normalization}'")
        self.alpha, self.mu, self.scale, self.normalization = alpha, mu, scale, normalization

    def forward(self, output: HeadOutput, labels: torch.Tensor | None = None) -> torch.Tensor:
        groups = len(output.parts)
        if groups < 2:
            return output.embedding.new_zeros(())
        parts = F.normalize(torch.stack(output.parts, dim=1), dim=-1)  # (B, P, D_V)
        cosines = parts @ parts.transpose(1, 2)  # (B, P, P): s between groups i and j of each image
        i, j = torch.triu_indices(groups, groups, offset=1, device=cosines.device)
        per_pair = F.softplus(self.alpha * self.scale * (cosines[:, i, j] - self.mu)).mean(dim=0)  # eq. 4
        divisor = groups - 1 if self.normalization == "groups_minus_one" else len(per_pair)
        return per_pair.sum() / divisor
