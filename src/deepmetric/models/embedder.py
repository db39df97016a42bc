"""``Embedder``: normalisation -> backbone trunk -> head, and ``create_model`` to build one by name."""

from __future__ import annotations

import contextlib
import itertools
import logging
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from .backbones import create_backbone
from .heads import Head, HeadOutput, build_head, head_class
from .modes import eval_mode


class Embedder(nn.Module):
    """Maps RGB images in [0, 1], shape (B, 3, H, W), to a ``HeadOutput``.

    The backbone's input normalisation (mean/std, channel order) is applied here, so the model is
    self-contained for evaluation, indexing and serving. ``spec`` holds the arguments of
    ``create_model`` that rebuild the architecture (saved with every checkpoint).
    """

    mean: torch.Tensor  # (1, 3, 1, 1) buffers (register_buffer)
    std: torch.Tensor

    def __init__(self, trunk: nn.Module, head: Head, mean: tuple, std: tuple, bgr: bool,
                 spec: dict[str, Any]):
        super().__init__()
        self.trunk = trunk
        self.head = head
        self.bgr = bgr
        self.spec = spec
        self.channels_last = False
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1), persistent=False)

    @property
    def embedding_dim(self) -> int:
        return self.head.embedding_dim

    def set_channels_last(self, enabled: bool = True) -> Embedder:
        """Store weights and activations channels-last (NHWC): about 2x faster convolutions on CPU."""
        self.channels_last = enabled
        return self.to(memory_format=torch.channels_last if enabled else torch.contiguous_format)

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        if self.bgr:
            images = images.flip(1)
        images = (images - self.mean) / self.std
        return images.contiguous(memory_format=torch.channels_last) if self.channels_last else images

    def forward(self, images: torch.Tensor) -> HeadOutput:
        return self.head(self.trunk(self.normalize(images)))

    @torch.no_grad()
    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) in [0, 1] -> (B, D) l2-normalised embeddings, in eval mode."""
        with eval_mode(self):
            return self(images).embedding

    @torch.no_grad()
    def initialize_head(self, image_batches: Iterable[torch.Tensor]) -> None:
        """Run ``head.initialize`` on the trunk features of these image batches ((B, 3, H, W) in [0, 1])."""
        with eval_mode(self):
            self.head.initialize(self.trunk(self.normalize(images)) for images in image_batches)

    def parameter_groups(self) -> dict[str, list[nn.Parameter]]:
        """The head's named groups (``pretrained``, ``new``, ...) with the trunk added to ``pretrained``;
        frozen parameters are left out."""
        groups = {name: [p for p in params if p.requires_grad] for name, params in self.head.parameter_groups().items()}
        groups["pretrained"] = [p for p in self.trunk.parameters() if p.requires_grad] + groups.get("pretrained", [])
        return {name: params for name, params in groups.items() if params}


MAX_MODEL_VALUES = 2_000_000_000
"""Most parameters and buffers a model may hold (8 GiB in float32): far above any model here (the largest preset, 8
GoogLeNet heads, holds 44 million; timm's largest ViTs about 1.8 billion), far below what a crafted checkpoint or a
typo asked for (``embedding_dim`` 3 x 10**9: 384 GB; JCF with 10**7 codewords: 10 GB). ``plan_model`` counts a
model's size on torch's meta device before any memory is allocated."""


@contextlib.contextmanager
def _silenced() -> Iterator[None]:
    """No log records of deepmetric's and no Python warnings: the plan's build says nothing that the real build
    will say again."""
    logger = logging.getLogger("deepmetric")

    def drop_all(record: logging.LogRecord) -> bool:
        return False

    logger.addFilter(drop_all)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.removeFilter(drop_all)


def plan_model(backbone: str = "lite0", head: str = "gap", embedding_dim: int = 512, split: str | None = None,
               freeze_bn: bool | str = True, **head_options: Any) -> Embedder:
    """The model ``create_model`` would build, on torch's meta device (shapes only: no memory, no weights read),
    once it is known to hold at most ``MAX_MODEL_VALUES`` parameters and buffers; else a ``ConfigError`` giving its
    size."""
    with torch.device("meta"), _silenced():
        plan = _build(backbone, head, embedding_dim, False, split, freeze_bn, None, False, head_options)
    values = sum(tensor.numel() for tensor in itertools.chain(plan.parameters(), plan.buffers()))
    if values > MAX_MODEL_VALUES:
        options = "".join(f", {name}={value!r}" for name, value in head_options.items())
        raise ConfigError(f"the model {backbone} + {head} (embedding_dim={embedding_dim}{options}) would hold "
                          f"{values:,} parameters and buffers ({values * 4 / 2**30:,.1f} GiB in float32); deepmetric "
                          f"builds at most {MAX_MODEL_VALUES:,} (the largest preset holds 44 million)")
    return plan


def create_model(backbone: str = "lite0", head: str = "gap", embedding_dim: int = 512, pretrained: bool = True,
                 split: str | None = None, freeze_bn: bool | str = True, weights: str | None = None,
                 trust_pickle: bool = False, **head_options: Any) -> Embedder:
    """Build an ``Embedder``: ``create_model(backbone="lite0", head="gap", embedding_dim=512)``.

    Args:
        backbone: a name of ``BACKBONES`` (``lite0``, ``googlenet``, ``inception-v1``, ``bn-inception``,
            ``resnet50``, ``tiny``) or ``timm:<model>``.
        head: a name of ``HEADS`` (``gap``, ``diablo``, ``abe``, ``dgml``, ``deml``, ``bilinear``, ``jcf``, ...).
        embedding_dim: D of the embedding (heads with M equal learners use M floor(D / M), DeML §3.1).
        pretrained: load the backbone's ImageNet weights (offline for ``lite0`` only).
        split: where the backbone is cut into trunk (local features F) and tail; None lets the head choose.
        freeze_bn: True turns BatchNorm into fixed affine layers (the usual choice with small P x K batches),
            ``"stats"`` fixes only its statistics (its weight and bias train), False neither.
        weights: a safetensors file of backbone weights (a pickled torch file only with ``trust_pickle``).
        trust_pickle: allow ``weights`` to be a legacy torch file (read with the restricted unpickler).
        **head_options: the head's options (``HEADS.options(head)`` lists them).

    Returns:
        The ``Embedder``: RGB images in [0, 1] (B, 3, H, W) -> ``HeadOutput``; ``embed`` gives (B, D) l2-normalised
        embeddings in eval mode. A model of more than ``MAX_MODEL_VALUES`` parameters and buffers is refused before
        any of it is allocated (``plan_model``).
    """
    plan_model(backbone, head, embedding_dim, split, freeze_bn, **head_options)
    return _build(backbone, head, embedding_dim, pretrained, split, freeze_bn, weights, trust_pickle, head_options)


def build_plan(plan: Embedder) -> Embedder:
    """The model ``plan`` (``plan_model``) describes, built for real with fresh weights (none read), for a
    checkpoint's weights to be loaded into once the plan's shapes were checked against them."""
    spec = dict(plan.spec)
    return _build(spec["backbone"], spec["head"], spec["embedding_dim"], False, spec["split"], spec["freeze_bn"], None,
                  False, spec["head_options"])


def _build(backbone: str, head: str, embedding_dim: int, pretrained: bool, split: str | None, freeze_bn: bool | str,
           weights: str | None, trust_pickle: bool, head_options: dict[str, Any]) -> Embedder:
    cls = head_class(head)
    split = split if split is not None else cls.default_split(backbone, **head_options)
    net = create_backbone(backbone, pretrained=pretrained, split=split, freeze_bn=freeze_bn, weights=weights,
                          trust_pickle=trust_pickle)
    head_module = build_head(head, net, embedding_dim, head_options)
    spec = {"backbone": backbone, "head": head, "embedding_dim": embedding_dim, "split": net.split,
            "freeze_bn": freeze_bn, "head_options": dict(head_options)}
    return Embedder(net.trunk, head_module, net.mean, net.std, net.bgr, spec)
