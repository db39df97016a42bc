"""DeML's trained parts (Chen & Deng, CVPR 2019, §3.2-3.3): the channel-attention modules and the decoupled learners.

- ``ChannelAttention``: J CAMs of one scale, ``cap_(i,j) = U ⊡ sigma(W2_(i,j) delta(W1_(i,j) Psi(U)))`` (§3.2),
  W1: C -> 64, W2: 64 -> C. ``pooled=True`` is the paper's squeeze-and-excitation form (Psi = spatial average,
  one gate per channel); ``pooled=False`` the released code's per-pixel form (two 1x1 convolutions on U itself,
  one gate per channel and position). Both with Caffe-xavier weights (U(±sqrt(3 / fan_in)), the filler of the
  code's prototxt) and zero biases, as in the code (the paper only says "random weights").
- ``DecoupledLearners``: the I x J CA learners, ``CA_(i,j) = omega_ij g`` with omega_ij in R^{d' x C},
  d' = floor(d / (I J)), no bias, Caffe-xavier as the code's InnerProduct (so each row omega_r starts with
  ||omega_r||^2 ~ 1, where L_ntri, eq. 6, is near 0); ``shared=True`` shares omega across the J learners of a scale,
  as the released code does (the paper's notation omega_ij gives each its own).
"""

from __future__ import annotations

import torch
from torch import nn

from ..init import caffe_xavier_uniform_


class ChannelAttention(nn.Module):
    """J gates of one scale computed together: (B, C, h, w) -> gates (B, J, C, 1, 1) pooled or (B, J, C, h, w)."""

    def __init__(self, channels: int, num_gates: int, hidden: int = 64, pooled: bool = True):
        super().__init__()
        self.channels, self.num_gates, self.pooled = channels, num_gates, pooled
        self.squeeze = nn.Conv2d(channels, num_gates * hidden, kernel_size=1)  # the J W1's as one 1x1 conv
        self.excite = nn.Conv2d(num_gates * hidden, num_gates * channels, kernel_size=1, groups=num_gates)  # J W2's
        caffe_xavier_uniform_(self.squeeze.weight, channels)  # the code's xavier filler, each gate's own fan-in
        caffe_xavier_uniform_(self.excite.weight, hidden)
        for conv in (self.squeeze, self.excite):
            assert conv.bias is not None  # built with Conv2d's default bias=True
            nn.init.zeros_(conv.bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        source = features.mean(dim=(2, 3), keepdim=True) if self.pooled else features  # Psi, or none (code)
        gates = torch.sigmoid(self.excite(torch.relu(self.squeeze(source))))
        b, _, h, w = gates.shape
        return gates.view(b, self.num_gates, self.channels, h, w)


class DecoupledLearners(nn.Module):
    """Pooled branch features (B, I, J, C) -> raw learner outputs (B, I, J, d')."""

    def __init__(self, num_scales: int, num_branches: int, in_channels: int, out_dim: int, shared: bool = False):
        super().__init__()
        self.num_branches = num_branches
        self.weight = nn.Parameter(torch.empty(num_scales, 1 if shared else num_branches, out_dim, in_channels))
        caffe_xavier_uniform_(self.weight, in_channels)  # the code's InnerProduct xavier filler: ||w_r||^2 ~ 1

    def matrices(self) -> torch.Tensor:
        """The distinct weight matrices (L, d', C): I x J of them, or I when shared."""
        return self.weight.flatten(0, 1)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        weight = self.weight.expand(-1, self.num_branches, -1, -1)
        return torch.einsum("bijc,ijdc->bijd", pooled, weight)
