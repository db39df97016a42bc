"""DGML's A-grouping (Xu et al., attentive grouping, §3.2): one learnable query per group attends over the
spatial positions of the feature map, and each group embedding is the attention-weighted sum of values.

For J (B, C, H, W):

- key and value, two 1x1 convolutions without bias, shared by all groups:
  ``K = Unfold_3(Conv_K(J))`` (D_K x HW, eq. 5) and ``V = Unfold_3(Conv_V(J))`` (D_V x HW, eq. 6).
  D_K = C // 8 by default (the paper leaves it open; the authors' code uses reduction 8: 256 on
  ResNet-50, 128 on GoogLeNet). D_V is the group width D // P (§4.1: "the embedding size of each group is
  the quotient of the total embedding size and the number of groups"; the code's ``val_conv`` outputs
  ``dim_per = full_dim // k``): 128 for 4 x 128, 170 for 3 x 170.
- queries ``Q = [q_1 .. q_P]`` (D_K x P), learned; initialised U(-1/sqrt(D_K), 1/sqrt(D_K)), the default
  initialisation of the code's per-group ``Conv2d(D_K, 1, 1)``.
- attention ``A = Softmax(Q^T K)`` (P x HW, eq. 7): row-wise softmax over the HW positions, plain inner
  product with no 1/sqrt(D_K) scaling (neither paper nor code scales).
- groups ``F = A V^T`` (P x D_V, eq. 8); optionally a shared ``Linear(D_V, D_V, bias=False)`` after it
  (``projection=true``, the code's ``LearnQ_he``; the default is its ``LearnQ_fen``, without).

Each group is then l2-normalised (see ``grouping.py``). Only the queries differ between groups. The 1x1
convolutions act on each position alone, the softmax permutes with the positions and the weighted sum
ignores their order, so the output is invariant to any permutation of J's spatial positions (Theorem 1,
eq. 13). ``attention`` holds
A folded back to (B, P, H, W) (eq. 9) for ``deepmetric explain``.

Parameter groups: ``key_value`` (the two convolutions), ``queries``, ``projection``: the code's three Adam
groups (``key_val_decay``, ``que_decay``, and the rest), so lambda_2 of eq. 14 can be set per group with
``train.groups.<name>.weight_decay``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ...errors import ConfigError
from .base import HeadOutput
from .grouping import GroupingHead
from .registry import HEADS


@HEADS.register("dgml")
class AGroupingHead(GroupingHead):
    has_attention_maps = True

    def __init__(self, in_channels: int, embedding_dim: int = 512, groups: int = 4, key_dim: int | None = None,
                 projection: bool = False):
        super().__init__(in_channels, embedding_dim, groups)
        self.key_dim = key_dim if key_dim is not None else in_channels // 8
        if self.key_dim < 1:
            raise ConfigError(f"head option key_dim must be at least 1, got {self.key_dim} (C // 8 of a "
                              f"{in_channels}-channel feature map; set key_dim explicitly)")
        self.key = nn.Conv2d(in_channels, self.key_dim, kernel_size=1, bias=False)
        self.value = nn.Conv2d(in_channels, self.group_dim, kernel_size=1, bias=False)
        bound = 1.0 / math.sqrt(self.key_dim)
        self.queries = nn.Parameter(torch.empty(groups, self.key_dim).uniform_(-bound, bound))  # Q^T: (P, D_K)
        self.projection = nn.Linear(self.group_dim, self.group_dim, bias=False) if projection else None

    def parameter_groups(self) -> dict[str, list[nn.Parameter]]:
        groups = {"pretrained": [], "key_value": [*self.key.parameters(), *self.value.parameters()],
                  "queries": [self.queries]}
        if self.projection is not None:
            groups["projection"] = list(self.projection.parameters())
        return groups

    def attend(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """J (B, C, H, W) -> group features F (B, P, D_V) (eq. 8) and attention A (B, P, HW) (eq. 7)."""
        keys = self.key(features).flatten(2)  # K: (B, D_K, HW), eq. 5
        values = self.value(features).flatten(2)  # V: (B, D_V, HW), eq. 6
        attention = torch.einsum("pk,bkn->bpn", self.queries, keys).softmax(dim=-1)  # eq. 7
        return attention @ values.transpose(1, 2), attention  # eq. 8

    def forward(self, features: torch.Tensor) -> HeadOutput:
        groups, attention = self.attend(features)
        if self.projection is not None:
            groups = self.projection(groups)
        height, width = features.shape[-2:]
        return self.grouped_output(groups, attention=attention.unflatten(2, (height, width)))  # eq. 9
