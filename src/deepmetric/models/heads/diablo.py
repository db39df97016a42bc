"""DIABLO: dictionary-based attention block (Jacob et al., PRL 2020; thesis §4.4).

N attention maps come from a softmax over dictionary entries of alpha * cos(phi(f), d), which makes the
maps complementary by construction (they sum to 1 over the entries) and replaces ABE's divergence loss:
DIABLO trains with the metric loss on the concatenated 512-d embedding only.

Options: ``selection`` ``dimension`` (eq. 10-13, the paper's best) or ``feature`` (eq. 5-9);
``strategy`` ``pre`` (eq. 3-4, the best: F = up to pool3, phi = a separate ImageNet-initialised copy of
inception 4a-4e, psi = scales 4-5 shared across maps) or ``post`` (eq. 1-2: F = up to pool4, phi and psi =
separate copies of inception 5a-5b); ``num_entries`` N in {2, 4, 8, 16}; ``alpha``.

Decisions where the papers are silent: alpha is not given ("a hyper-parameter to control the hardness of the
assignment", §3.3). The default 10 is a placeholder no benchmark has validated: at initialisation, cosines of
the m-dimensional phi features with random directions are small (std ~ 1/sqrt(m)), so the maps start close
to uniform; on the demo data alpha = 30 did better (docs/studies/glyphs-demos.md's ablation).
Scale compensation (``scale_compensation``; an adaptation, not in the paper): the maps are a softmax over the N
entries, so the pre-attention merge H_n = A_n ⊙ F carries on average F / N into the shared tail psi. The paper's
GoogLeNet (Caffe) has no BatchNorm, and psi's convolutions and ReLUs are then positively homogeneous: the scale
passes through to the l2-normalised embedding. A tail with BatchNorm (frozen statistics: Lite0, torchvision's
GoogLeNet, ResNet) is not: fed F / 8, untrained Lite0 + GAP retrieves at R@1 58.8 instead of 68.3 on the
emoji validation classes. With compensation the merge is N · A_n ⊙ F, whose mean over the entries is exactly
F. ``auto`` (the default) compensates where psi has a BatchNorm layer and not otherwise (``inception-v1``,
the paper's network); ``true`` / ``false`` force it.
The dictionary is initialised from a standard normal (random directions; cosine is scale-free). Each
branch has its own embedding layer ("an embedding layer for each branch", §3.1; same parameter count as
one shared C x D layer); ``shared_embedding=True`` shares it as ABE does.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ...errors import ConfigError
from ..attention_layouts import attention_layout
from ..backbones import Backbone
from .attention import DimensionWiseSelection, FeatureWiseSelection, MultiBranchHead, copy_stages, phi_channels
from .registry import HEADS


@HEADS.register("diablo")
class DIABLOHead(MultiBranchHead):
    metric_on = "embedding"
    part_name = "entry"

    @classmethod
    def default_split(cls, backbone_name: str, **options: Any) -> str | None:
        return attention_layout(backbone_name, options.get("strategy", "pre"))[0]

    @classmethod
    def from_backbone(cls, backbone: Backbone, embedding_dim: int, selection: str = "dimension",
                      strategy: str = "pre", num_entries: int = 8, alpha: float = 10.0,
                      shared_embedding: bool = False, phi_stages: list[str] | None = None,
                      tail_chunk: int | str | None = "auto", scale_compensation: bool | str = "auto") -> DIABLOHead:
        if selection not in ("dimension", "feature"):
            raise ConfigError(f"diablo: selection must be 'dimension' or 'feature', got '{selection}'")
        if num_entries < 1:
            raise ConfigError(f"diablo: num_entries must be at least 1, got {num_entries}")
        names = tuple(phi_stages) if phi_stages else attention_layout(backbone.name, strategy)[1]
        phi = copy_stages(backbone.tail, names)
        m = phi_channels(backbone, names)
        weighted = backbone.channels if strategy == "pre" else backbone.tail_channels
        selector = (DimensionWiseSelection(num_entries, weighted, m, alpha) if selection == "dimension"
                    else FeatureWiseSelection(num_entries, m, alpha))
        if scale_compensation not in (True, False, "auto"):
            raise ConfigError(f"diablo: scale_compensation must be true, false or auto, got {scale_compensation!r}")
        if scale_compensation == "auto":
            scale_compensation = has_batch_norm(backbone.tail)
        return cls(psi=backbone.tail, phi=phi, selector=selector, num_branches=num_entries,
                   psi_channels=backbone.tail_channels, embedding_dim=embedding_dim, strategy=strategy,
                   shared_embedding=shared_embedding, tail_chunk=tail_chunk,
                   merge_scale=float(num_entries) if scale_compensation and strategy == "pre" else 1.0)


def has_batch_norm(module: nn.Module) -> bool:
    """Whether ``module`` holds a BatchNorm layer of any kind (torch's, its frozen-statistics subclass, timm's
    FrozenBatchNorm2d and BatchNormAct2d), which makes it not scale-equivariant."""
    return any("BatchNorm" in type(m).__name__ for m in module.modules())
