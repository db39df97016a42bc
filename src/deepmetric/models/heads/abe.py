"""ABE: attention-based ensemble (Kim et al., ECCV 2018), and its M-heads baseline.

ABE-M (eq. 7): ``B_m(x) = G(S(x) ∘ A_m(S(x)))`` with the spatial extractor S (GoogLeNet up to pool3), a
shared attention trunk C (a separate ImageNet-initialised copy of inception 4a-4e), one 1x1 convolution
832 -> 480 + sigmoid per learner (A'_m), the shared global embedding G (inception 4a-5b, GAP) and one
shared final layer 1024 -> 512/M without bias; per-learner l2, concatenated. The masks' convolutions and the
final layers are Glorot-initialised (§4). Trained with a metric loss
per learner, summed (eq. 8), plus the divergence loss (eq. 9, ``losses/divergence.py``) with
lambda_div = 1. ABE-1 (one learner) has no divergence term (no pair of learners). ``branch_feature_map``
exposes the M learners' tail maps (inception 5b) for the HORDE regulariser (ABE + HORDE, thesis §5.5.3).

M-heads (eq. 4, Fig. 1a): S shared, a separate copy of G and of the final layer per head, no attention.
With GoogLeNet (original architecture) and D = 512 the parameter counts are ABE Table 1's:
1-head 6,497,840; ABE-1 9,706,848; ABE-8 12,046,976; 8-heads 43,574,768.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import ConfigError
from ..attention_layouts import attention_layout
from ..backbones import Backbone
from ..init import glorot_uniform_
from .attention import MultiBranchHead, SigmoidMasks, copy_stages, phi_channels
from .base import Head, HeadOutput, each_part, learner_dim
from .registry import HEADS


@HEADS.register("abe")
class ABEHead(MultiBranchHead):
    metric_on = "parts"
    parts_reduction = "sum"
    part_name = "learner"
    individual_learners = "abe.learner"
    default_regularizers = {"divergence": {"weight": 1.0, "margin": 1.0}}

    @classmethod
    def default_split(cls, backbone_name: str, **options: Any) -> str | None:
        return attention_layout(backbone_name, "pre")[0]

    def auxiliary_embeddings(self, output: HeadOutput) -> dict[str, torch.Tensor]:
        """Each learner alone (Tables 1-2's "individual learners")."""
        return each_part(output, self.individual_learners)

    @classmethod
    def from_backbone(cls, backbone: Backbone, embedding_dim: int, num_learners: int = 8,
                      phi_stages: list[str] | None = None, tail_chunk: int | str | None = "auto",
                      branch_feature_map: bool = False) -> ABEHead:
        if num_learners < 1:
            raise ConfigError(f"abe: num_learners must be at least 1, got {num_learners}")
        names = tuple(phi_stages) if phi_stages else attention_layout(backbone.name, "pre")[1]
        phi = copy_stages(backbone.tail, names)  # the shared attention trunk C
        masks = SigmoidMasks(num_learners, phi_channels(backbone, names), backbone.channels)
        return cls(psi=backbone.tail, phi=phi, selector=masks, num_branches=num_learners,
                   psi_channels=backbone.tail_channels, embedding_dim=embedding_dim, strategy="pre",
                   shared_embedding=True, tail_chunk=tail_chunk, branch_feature_map=branch_feature_map,
                   glorot_embedding=True)


@HEADS.register("mheads")
class MHeadsHead(Head):
    """M-heads: ``b_m(x) = G_m(S(x))`` with a separate copy of the tail and final layer per head."""

    pretrained_modules = ("tails",)
    metric_on = "parts"
    parts_reduction = "sum"
    individual_learners = "mheads.head"

    @classmethod
    def default_split(cls, backbone_name: str, **options: Any) -> str | None:
        return attention_layout(backbone_name, "pre")[0]

    def __init__(self, tail: nn.Module, in_channels: int, embedding_dim: int = 512, num_heads: int = 8):
        super().__init__()
        per_head = learner_dim("mheads", embedding_dim, num_heads)
        self.embedding_dim, self.num_heads = per_head * num_heads, num_heads
        self.tails = nn.ModuleList([tail] + [copy.deepcopy(tail) for _ in range(num_heads - 1)])
        embeds = [nn.Linear(in_channels, per_head, bias=False) for _ in range(num_heads)]
        for embed in embeds:  # ABE §4: the final layers are Glorot-initialised
            glorot_uniform_(embed.weight, in_channels, per_head)
        self.embeds = nn.ModuleList(embeds)

    @property
    def num_parts(self) -> int:
        return self.num_heads

    def auxiliary_embeddings(self, output: HeadOutput) -> dict[str, torch.Tensor]:
        """Each head alone (ABE Table 1's individual learners of the M-heads ensembles)."""
        return each_part(output, self.individual_learners)

    def forward(self, features: torch.Tensor) -> HeadOutput:
        parts = [F.normalize(embed(tail(features).mean(dim=(2, 3))), dim=1)
                 for tail, embed in zip(self.tails, self.embeds, strict=True)]
        embedding = torch.cat(parts, dim=1) / math.sqrt(self.num_heads)
        return HeadOutput(embedding=embedding, parts=parts, extras={"feature_map": features})
