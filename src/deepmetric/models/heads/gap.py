"""The baseline of every paper: global average pooling -> linear embedding -> l2.

``z = W^T GAP(psi(F)) / ||W^T GAP(psi(F))||`` (thesis §1: aggregate, project, normalise). The linear
layer has no bias, as in the authors' code (ABE: ``Dense(512, use_bias=False)``) and as the ABE Table 1
parameter count (1024 x 512 on top of GoogLeNet) requires. ``embedding_dim=0`` skips the projection:
the l2-normalised pooled backbone features, i.e. the off-the-shelf baseline of an untrained model.
``use_tail=False`` pools the trunk's output F itself (the tail is not run): the first-order control of
heads that pool F at a chosen ``model.split`` (``bilinear``, ``jcf``; thesis Table 4.2's baseline).
``l2=False`` leaves the embedding unnormalised (MIRAGE's 2-D latent space of thesis Fig. 6.3b).

The head is MIRAGE's encoder (thesis eq. 6.1, ``x = E(f) = W^T f / ||W^T f||``): it puts the pooled vector f in
``extras["pooled"]`` and ``encode(f)`` re-embeds any (B, C) feature vectors, e.g. generated ones.

It is also DeML's unified-metric baseline ``Ud`` (one learner, the linear layer): with a projection, in training
mode, it puts the learner's raw outputs ``W^T f`` and its weights in ``extras["learner_activations"]`` (B, 1, D),
``["learner_activations_fc_only"]`` (from a detached f) and ``["learner_weights"]`` (1, D, C), which DeML's
activation decay reads (``U512 + L_act``, DeML Table 1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..backbones import Backbone
from .base import Head, HeadOutput
from .registry import HEADS


@HEADS.register("gap")
class GAPHead(Head):
    pretrained_modules = ("tail",)

    def __init__(self, tail: nn.Module, in_channels: int, embedding_dim: int = 512, l2: bool = True):
        super().__init__()
        self.pooled_dim = in_channels  # size of extras["pooled"], the input of encode (MIRAGE's feature space)
        self.normalized = l2
        self.tail = tail
        self.feature_channels = in_channels  # channels of extras["feature_map"], for regularisers (HORDE)
        self.embedding_dim = embedding_dim or in_channels
        self.embed = nn.Linear(in_channels, embedding_dim, bias=False) if embedding_dim else nn.Identity()

    @classmethod
    def from_backbone(cls, backbone: Backbone, embedding_dim: int, use_tail: bool = True, l2: bool = True) -> GAPHead:
        if use_tail:
            return cls(tail=backbone.tail, in_channels=backbone.tail_channels, embedding_dim=embedding_dim, l2=l2)
        return cls(tail=nn.Identity(), in_channels=backbone.channels, embedding_dim=embedding_dim, l2=l2)

    def encode(self, pooled: torch.Tensor) -> torch.Tensor:
        """E(f) (eq. 6.1): (B, C) pooled features -> (B, D) embeddings, l2-normalised unless ``l2=False``."""
        return self._normalize(self.embed(pooled))

    def _normalize(self, raw: torch.Tensor) -> torch.Tensor:
        return F.normalize(raw, dim=1) if self.normalized else raw

    def forward(self, features: torch.Tensor) -> HeadOutput:
        feature_map = self.tail(features)  # (B, C, h, w)
        pooled = feature_map.mean(dim=(2, 3))  # (B, C)
        raw = self.embed(pooled)
        embedding = self._normalize(raw)  # encode(pooled), with the raw outputs kept
        extras = {"feature_map": feature_map, "pooled": pooled}
        if self.training and isinstance(self.embed, nn.Linear):  # DeML's activation decay (a training loss)
            extras.update(learner_activations=raw[:, None], learner_weights=self.embed.weight[None],
                          learner_activations_fc_only=self.embed(pooled.detach())[:, None])
        return HeadOutput(embedding=embedding, parts=[embedding], extras=extras)
