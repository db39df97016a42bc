"""DeML: hybrid-attention based decoupled metric learning (Chen & Deng, CVPR 2019).

``phi[x] = {OA_1[x^1]; ...; OA_I[x^I]}``, ``OA_i = {CA_(i,1); ...; CA_(i,J)}`` (eq. 1), with
``CA_(i,j)[x^i] = CA_(i,j)(g^i(CAM_(i,j)(f^i(x^i))))``:

- scale i has its own copy of the whole backbone, cut at the CAM insertion point into FNet^i (f^i) and GNet^i
  (g^i); x^1 is the image and x^(i+1) the crop of x^i proposed by the OAM (``deml_oam.py``, eqs. 2-3) from the
  source layers of scale i (the first CAM branch's, as the code does), zoomed to the input size, no gradient;
- J CAMs per scale gate f^i(x^i) (``ChannelAttention``); g^i is shared by the J branches and run on them as one
  batch of J·B maps;
- I x J learners (no bias) of floor(d / (I J)) dimensions each on the average-pooled g^i outputs, each
  l2-normalised; the retrieval embedding is their scale-major concatenation divided by sqrt(I J), so its
  cosine is the mean of the per-learner cosines (what cosine retrieval on the concatenation ranks by).

Training (the head's defaults, overridable in the config): the metric loss per learner, averaged (eq. 5; the
presets use binomial deviance with alpha 2, beta 0.5, negative weight 35), the adversarial diversity constraint
(eq. 4, ``deml-adversary``, lambda_0 = 1), activation decay (eq. 6, ``activation-decay``, lambda_1 = 0.014) and
the row-norm term L_ntri (``learner-row-norm``, lambda_2 = 0.25); learners, gates and the adversary at 10x the
learning rate (``default_groups``). The released code's hinge (``deml-hinge``, weight 0.2) replaces the adversary
with ``loss.regularizers``.

The head needs the image, so the backbone is cut at ``input`` (an identity trunk; ``default_split``).
``attention`` (B, I, H, W) holds each scale's OAM map placed at the region of the image that scale saw;
``extras`` hold the scale inputs, those regions, and what the regularisers need.
"""

from __future__ import annotations

import copy
import math
from collections import OrderedDict
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import ConfigError
from ..backbones import Backbone
from .base import Head, HeadOutput, learner_dim
from .deml_modules import ChannelAttention, DecoupledLearners
from .deml_oam import attention_boxes, compose_boxes, crop_and_zoom, object_attention, paste
from .registry import HEADS

# Per backbone, the CAM insertion point and the OAM source layers of the paper (CAMs after pool3; OAM on
# inception 4e + 5b) and of the released code (CAMs after inception 4b; OAM on 5b). Elsewhere the analogous
# points: "paper" cuts where the other attention heads do (the first stage at stride 16) and takes the last
# stride-16 stage + the last stage; "code" cuts at the next named stage and takes the last stage only.
DEML_LAYOUTS: dict[str, dict[str, tuple[str, tuple[str, ...]]]] = {
    "googlenet": {"paper": ("pool3", ("inception4e", "inception5b")), "code": ("inception4b", ("inception5b",))},
    "lite0": {"paper": ("stage4", ("stage5", "head")), "code": ("stage5", ("head",))},
    "resnet50": {"paper": ("layer2", ("layer3", "layer4")), "code": ("layer3", ("layer4",))},
    "tiny": {"paper": ("stage1", ("stage2", "stage3")), "code": ("stage2", ("stage3",))},
}
DEML_LAYOUTS["inception-v1"] = DEML_LAYOUTS["googlenet"]


def _layout(backbone: str, setting: str) -> tuple[str, tuple[str, ...]]:
    if backbone not in DEML_LAYOUTS:
        raise ConfigError(f"deml has no '{setting}' layout for backbone '{backbone}'; give the stages by name "
                          f"(head options cam_at and oam_layers) or use one of {', '.join(DEML_LAYOUTS)}")
    return DEML_LAYOUTS[backbone][setting]


def _split_stages(tail: nn.Module, cut: str) -> tuple[nn.Sequential, nn.Sequential]:
    """(stages up to and including ``cut``, the stages after it) of ``tail``, sharing its modules."""
    stages = list(tail.named_children())
    names = [n for n, _ in stages]
    index = names.index(cut) + 1
    return nn.Sequential(OrderedDict(stages[:index])), nn.Sequential(OrderedDict(stages[index:]))


@HEADS.register("deml")
class DeMLHead(Head):
    pretrained_modules = ("fnets", "gnets")
    metric_on = "parts"
    has_attention_maps = True
    part_name = "scale"  # the attention maps are the I scales' OAM maps, not the I x J learners
    parts_reduction = "mean"  # eq. 5: 1/(IJ) sum over learners
    default_regularizers = {"deml-adversary": {"weight": 1.0}, "activation-decay": {"weight": 0.014},
                            "learner-row-norm": {"weight": 0.25}}
    default_groups = {"learners": {"lr_scale": 10.0}, "gates": {"lr_scale": 10.0}, "loss": {"lr_scale": 10.0}}

    def __init__(self, fnet: nn.Sequential, gnet: nn.Sequential, channels: int, out_channels: int,
                 embedding_dim: int, num_scales: int, num_branches: int, cam_form: str, cam_hidden: int,
                 oam_layers: tuple[str, ...], oam_steps: int, spatial_sigma: float, share_learners: bool):
        super().__init__()
        self.num_scales, self.num_branches = num_scales, num_branches
        self.part_dim = learner_dim("deml", embedding_dim, num_scales * num_branches)
        self.embedding_dim = self.part_dim * num_scales * num_branches
        self.oam_layers, self.oam_steps, self.spatial_sigma = oam_layers, oam_steps, spatial_sigma
        self.fnets = nn.ModuleList([fnet] + [copy.deepcopy(fnet) for _ in range(num_scales - 1)])
        self.gnets = nn.ModuleList([gnet] + [copy.deepcopy(gnet) for _ in range(num_scales - 1)])
        self.gates = nn.ModuleList(ChannelAttention(channels, num_branches, cam_hidden, cam_form == "pooled")
                                   for _ in range(num_scales))
        self.learners = DecoupledLearners(num_scales, num_branches, out_channels, self.part_dim, share_learners)

    @classmethod
    def default_split(cls, backbone_name: str, **options: Any) -> str | None:
        return "input"

    @classmethod
    def from_backbone(cls, backbone: Backbone, embedding_dim: int, num_scales: int = 3, num_branches: int = 3,
                      cam_at: str = "paper", cam_form: str = "pooled", cam_hidden: int = 64,
                      oam_layers: str | list[str] = "paper", oam_steps: int = 10, spatial_sigma: float = 0.0,
                      share_learners: bool = False) -> DeMLHead:
        """``num_scales`` I, ``num_branches`` J; ``cam_at`` a stage name or ``paper``/``code`` (``DEML_LAYOUTS``);
        ``cam_form`` ``pooled`` (paper) or ``pixel`` (code); ``oam_layers`` stage names or ``paper``/``code``;
        ``spatial_sigma`` 0 (paper) or 0.15 (code's Gaussian kernel); ``share_learners`` (code: one omega per scale)."""
        if backbone.split != "input":
            raise ConfigError(f"deml crops the input image, so the backbone must be cut at 'input' (leave model.split "
                              f"unset); got model.split={backbone.split}")
        if num_scales < 1 or num_branches < 1:
            raise ConfigError(f"deml: num_scales and num_branches must be at least 1, got {num_scales}, {num_branches}")
        if cam_form not in ("pooled", "pixel"):
            raise ConfigError(f"deml: cam_form must be 'pooled' (paper) or 'pixel' (code), got '{cam_form}'")
        stages = [n for n, _ in backbone.tail.named_children()]
        if cam_at in ("paper", "code"):
            cam_at = _layout(backbone.name, cam_at)[0]
        layers = tuple(_layout(backbone.name, oam_layers)[1] if isinstance(oam_layers, str) else oam_layers)
        for option, names in (("cam_at", (cam_at,)), ("oam_layers", layers)):
            unknown = [n for n in names if n not in stages]
            if unknown or not names:
                raise ConfigError(f"deml: {option} names {unknown or 'no stage'}; the backbone's stages are "
                                  f"{', '.join(stages)} (or use 'paper' / 'code')")
        fnet, gnet = _split_stages(backbone.tail, cam_at)
        return cls(fnet, gnet, backbone.stage_channels[cam_at], backbone.tail_channels, embedding_dim, num_scales,
                   num_branches, cam_form, cam_hidden, layers, oam_steps, float(spatial_sigma), share_learners)

    @property
    def num_parts(self) -> int:
        return self.num_scales * self.num_branches

    def export_blocker(self) -> str | None:
        """With more than one scale, the object-attention module's crop box comes from the connected components
        of the attention map (SciPy's on the host, or a label propagation that runs until it settles on a GPU): a
        traced graph would keep the example images' boxes."""
        if self.num_scales < 2:
            return None
        return (f"with {self.num_scales} scales, each scale's crop box is found by the object-attention module "
                "from the attention map's connected components (attention_boxes), a data-dependent step that a "
                "traced graph would freeze to the example image's box; use deepmetric embed / index / serve for "
                "this run, or export a run trained with head_options.num_scales=1")

    @property
    def num_maps(self) -> int:
        return self.num_scales

    def auxiliary_embeddings(self, output: HeadOutput) -> dict[str, torch.Tensor]:
        """Each OA root-learner alone (Table 2's O columns): scale i's J learners concatenated, / sqrt(J), so
        l2-normalised like the whole embedding; none with a single scale (the root-learner is the embedding)."""
        if self.num_scales < 2:
            return {}
        j = self.num_branches
        return {f"deml.scale{i + 1}": torch.cat(output.parts[i * j:(i + 1) * j], dim=1) / math.sqrt(j)
                for i in range(self.num_scales)}

    def parameter_groups(self) -> dict[str, list[nn.Parameter]]:
        return {"pretrained": self.pretrained_parameters(), "gates": list(self.gates.parameters()),
                "learners": list(self.learners.parameters())}

    def scale_features(self, scale: int, images: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Pooled g^i outputs of the J branches (B, J, C') and the OAM source maps of scale ``scale``."""
        b, j = images.shape[0], self.num_branches
        found: dict[str, torch.Tensor] = {}
        u = images
        for name, stage in self.fnets[scale].named_children():
            u = stage(u)
            if name in self.oam_layers:
                found[name] = u  # before the gates: shared by the J branches
        gates = self.gates[scale](u)  # (B, J, C, 1 or h, 1 or w)
        v = (u.unsqueeze(1) * gates).transpose(0, 1).flatten(0, 1)  # (J·B, C, h, w), branch-major
        if images.is_contiguous(memory_format=torch.channels_last):
            v = v.contiguous(memory_format=torch.channels_last)
        for name, stage in self.gnets[scale].named_children():
            v = stage(v)
            if name in self.oam_layers:
                found[name] = v[:b]  # the first CAM branch's map, as the code's OAM input
        pooled = v.mean(dim=(2, 3)).view(j, b, -1).transpose(0, 1)
        return pooled, [found[n] for n in self.oam_layers]

    def forward(self, features: torch.Tensor) -> HeadOutput:
        images = features  # (B, 3, H, W): the normalised image (identity trunk)
        b, size = images.shape[0], (images.shape[-2], images.shape[-1])
        region = images.new_tensor([0.0, 0.0, size[1], size[0]]).expand(b, 4)
        x, pooled, inputs, regions, maps = images, [], [], [], []
        for scale in range(self.num_scales):
            scale_pooled, sources = self.scale_features(scale, x)
            attention = object_attention(sources, size, self.oam_steps, self.spatial_sigma)  # (B, H, W), x's frame
            pooled.append(scale_pooled)
            inputs.append(x.detach())
            regions.append(region)
            maps.append(attention if scale == 0 else paste(attention, region))
            if scale + 1 < self.num_scales:
                box = attention_boxes(attention)
                x = crop_and_zoom(x, box)
                if images.is_contiguous(memory_format=torch.channels_last):
                    x = x.contiguous(memory_format=torch.channels_last)
                region = compose_boxes(region, box, size)
        pooled_all = torch.stack(pooled, dim=1)  # (B, I, J, C')
        raw = self.learners(pooled_all)  # (B, I, J, d')
        parts = list(F.normalize(raw, dim=3).flatten(1, 2).unbind(dim=1))  # scale-major
        embedding = torch.cat(parts, dim=1) / math.sqrt(len(parts))
        extras = {
            "scale_inputs": torch.stack(inputs, dim=1),  # (B, I, 3, H, W), normalised like the head's input
            "regions": torch.stack(regions, dim=1),  # (B, I, 4): (x0, y0, x1, y1) of the image each scale saw
            "learner_activations": raw.flatten(1, 2),  # (B, I·J, d') for activation decay (eq. 6)
            "learner_activations_fc_only": self.learners(pooled_all.detach()).flatten(1, 2),  # code's L_act path
            "learner_weights": self.learners.matrices(),  # (L, d', C') for L_ntri (eq. 6)
        }
        return HeadOutput(embedding=embedding, parts=parts, attention=torch.stack(maps, dim=1), extras=extras)
