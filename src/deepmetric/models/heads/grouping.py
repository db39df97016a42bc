"""What every DGML grouping module shares (Xu et al., "Towards Improved and Interpretable Deep Metric
Learning via Attentive Grouping", §3.1).

A grouping module maps the feature map J (B, C, H, W) to P group embeddings of width D_V = D // P
(``embedding_dim=512, groups=3`` gives 3 x 170 = 510, as the authors' code computes ``512 // 3``). Each
group is l2-normalised on its own (the code's ``F.normalize(x, dim=-1)`` on B x P x D_V); the retrieval
embedding is their concatenation, re-normalised to unit length as the head contract requires. That
division by sqrt(P) changes no ranking: every concatenation has norm sqrt(P), so its cosine similarity is
the mean of the per-group cosines and orders neighbours exactly as the code's L2 distance does.

J is the trunk's output F: ``model.split`` chooses the map (None: the backbone's last, as the paper);
the backbone's blocks above the split are not used. The defaults make ``--head NAME`` train the
paper's objective: the metric loss on each group, averaged over groups (eq. 14's first term, and the
code's ``loss_emb /= k``), plus the diversity loss (eq. 4) with lambda_1 = 0.01 (Tables 3/4).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ...errors import ConfigError
from ..backbones import Backbone
from .base import Head, HeadOutput, learner_dim


class GroupingHead(Head):
    """Base class: ``groups`` (P) embeddings of ``embedding_dim // groups`` dimensions from F."""

    metric_on = "parts"
    part_name = "group"
    parts_reduction = "mean"
    default_regularizers = {"diversity": {"weight": 0.01}}

    def __init__(self, in_channels: int, embedding_dim: int = 512, groups: int = 4):
        super().__init__()
        if groups < 1:
            raise ConfigError(f"head option groups must be at least 1, got {groups}")
        if embedding_dim < groups:
            raise ConfigError(f"model.embedding_dim={embedding_dim} is too small for {groups} groups (each group "
                              "needs at least one dimension)")
        self.in_channels = in_channels
        self.groups = groups
        self.group_dim = learner_dim("grouping", embedding_dim, groups)
        self.embedding_dim = groups * self.group_dim

    @classmethod
    def from_backbone(cls, backbone: Backbone, embedding_dim: int, **options: Any) -> Head:
        """Built on the trunk's output F (``backbone.channels``); the tail is left out of the model."""
        return cls(in_channels=backbone.channels, embedding_dim=embedding_dim, **options)

    @property
    def num_parts(self) -> int:
        return self.groups

    def grouped_output(self, groups: torch.Tensor, attention: torch.Tensor | None = None,
                       extras: dict[str, torch.Tensor] | None = None) -> HeadOutput:
        """(B, P, D_V) group features -> l2-normalised parts and their normalised concatenation."""
        parts = F.normalize(groups, dim=-1)
        embedding = F.normalize(parts.flatten(1), dim=1)
        return HeadOutput(embedding=embedding, parts=list(parts.unbind(1)), attention=attention,
                          extras=extras or {})
