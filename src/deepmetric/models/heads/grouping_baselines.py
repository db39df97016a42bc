"""The grouping modules DGML compares A-grouping with (Tables 3 and 4). The paper's Appendix A, which
defines them, is missing from its text; the layers are those of the authors' code
(``architectures/group_layers.py``):

- ``n-grouping`` (``LinearEmb``): GAP -> Linear(C, D, no bias); no grouping (1 x 512).
- ``m-grouping`` (``MulLinear``, BIER-style): GAP -> Linear(C, P * D/P, no bias), split into P groups.
- ``g-grouping`` (``Gate``, ABE-style): a shared 1x1 conv C -> C/r (with bias, r = 8); per group a 1x1 conv
  C/r -> C (with bias) gives mask_p, with no sigmoid; GAP(J * mask_p) -> shared Linear(C, D/P, no bias).
- ``c-grouping`` (``Channel``, SE channel attention): per group an SE block (GAP -> FC C -> C/5 -> ReLU ->
  FC C/5 -> C -> sigmoid, no biases) reweights J's channels; GAP -> shared Linear(C, D/P, with bias).

G- and C-grouping return, as ``attention``, what the paper's Figure 5 shows for them: per group, the
map of the channel with the strongest response (the largest pooled value of the group's reweighted
features, which is what enters its embedding). These maps are responses, not distributions.
"""

from __future__ import annotations

import torch
from torch import nn

from .base import HeadOutput
from .grouping import GroupingHead
from .registry import HEADS


def pick_channel(tensor: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Channel ``index[b, p]`` of ``tensor[b, p]``: (B, P or 1, C, ...) and (B, P) -> (B, P, ...)."""
    tensor = tensor.expand(*index.shape, *tensor.shape[2:])
    index = index.view(*index.shape, 1, *[1] * (tensor.dim() - 3)).expand(*index.shape, 1, *tensor.shape[3:])
    return tensor.gather(2, index).squeeze(2)


@HEADS.register("n-grouping")
class NGroupingHead(GroupingHead):
    """No grouping: GAP -> Linear(C, D, no bias) -> l2 (the GAP baseline on F)."""

    default_regularizers = {}

    def __init__(self, in_channels: int, embedding_dim: int = 512):
        super().__init__(in_channels, embedding_dim, groups=1)
        self.embed = nn.Linear(in_channels, self.embedding_dim, bias=False)

    def forward(self, features: torch.Tensor) -> HeadOutput:
        return self.grouped_output(self.embed(features.mean(dim=(2, 3)))[:, None])


@HEADS.register("m-grouping")
class MGroupingHead(GroupingHead):
    """Multi-linear: one Linear(C, P * D_V, no bias) on GAP, split into P groups."""

    def __init__(self, in_channels: int, embedding_dim: int = 512, groups: int = 4):
        super().__init__(in_channels, embedding_dim, groups)
        self.embed = nn.Linear(in_channels, self.groups * self.group_dim, bias=False)

    def forward(self, features: torch.Tensor) -> HeadOutput:
        return self.grouped_output(self.embed(features.mean(dim=(2, 3))).unflatten(1, (self.groups, self.group_dim)))


@HEADS.register("g-grouping")
class GGroupingHead(GroupingHead):
    """Gated: per-group spatial-and-channel masks from a shared bottleneck (no sigmoid, as in the code)."""

    has_attention_maps = True

    def __init__(self, in_channels: int, embedding_dim: int = 512, groups: int = 4, reduction: int = 8):
        super().__init__(in_channels, embedding_dim, groups)
        hidden = max(1, in_channels // reduction)
        self.shared = nn.Conv2d(in_channels, hidden, kernel_size=1)
        self.masks = nn.Conv2d(hidden, groups * in_channels, kernel_size=1)  # the P per-group convs, stacked
        self.embed = nn.Linear(in_channels, self.group_dim, bias=False)

    def forward(self, features: torch.Tensor) -> HeadOutput:
        batch, channels, height, width = features.shape
        masks = self.masks(self.shared(features)).view(batch, self.groups, channels, height, width)
        gated = features[:, None] * masks  # (B, P, C, H, W)
        pooled = gated.mean(dim=(3, 4))  # (B, P, C)
        strongest = pooled.argmax(dim=2)  # (B, P)
        return self.grouped_output(self.embed(pooled), attention=pick_channel(gated, strongest))


@HEADS.register("c-grouping")
class CGroupingHead(GroupingHead):
    """Channel attention: one squeeze-and-excitation block per group on the shared feature map."""

    has_attention_maps = True

    def __init__(self, in_channels: int, embedding_dim: int = 512, groups: int = 4, se_reduction: int = 5):
        super().__init__(in_channels, embedding_dim, groups)
        hidden = max(1, in_channels // se_reduction)
        self.squeeze = nn.ModuleList(nn.Linear(in_channels, hidden, bias=False) for _ in range(groups))
        self.excite = nn.ModuleList(nn.Linear(hidden, in_channels, bias=False) for _ in range(groups))
        self.embed = nn.Linear(in_channels, self.group_dim, bias=True)

    def forward(self, features: torch.Tensor) -> HeadOutput:
        pooled = features.mean(dim=(2, 3))  # (B, C)
        weights = torch.stack([torch.sigmoid(excite(torch.relu(squeeze(pooled))))
                               for squeeze, excite in zip(self.squeeze, self.excite, strict=True)], dim=1)
        weighted = weights * pooled[:, None]  # GAP(w_p * J) = w_p * GAP(J): (B, P, C)
        strongest = weighted.argmax(dim=2)  # (B, P)
        maps = pick_channel(features[:, None], strongest) * pick_channel(weights, strongest)[..., None, None]
        return self.grouped_output(self.embed(weighted), attention=maps)
