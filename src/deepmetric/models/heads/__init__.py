"""Head registry: ``HEADS`` names every ``Head`` subclass; a head is built with ``Head.from_backbone``."""

from __future__ import annotations

from typing import Any

from ...registry import Registry
from ..backbones import Backbone
from .abe import ABEHead, MHeadsHead
from .base import Head, HeadOutput
from .deml import DeMLHead
from .dgml import AGroupingHead
from .diablo import DIABLOHead
from .gap import GAPHead
from .grouping_baselines import CGroupingHead, GGroupingHead, MGroupingHead, NGroupingHead
from .jcf import JCFHead
from .second_order import SecondOrderHead

__all__ = ["HEADS", "Head", "HeadOutput", "build_head", "check_head_options", "head_class"]

HEADS: Registry[type[Head]] = Registry("head", options_of=lambda cls: cls.option_names())
for _name, _cls in {"gap": GAPHead, "diablo": DIABLOHead, "abe": ABEHead, "mheads": MHeadsHead,
                    "dgml": AGroupingHead, "n-grouping": NGroupingHead, "m-grouping": MGroupingHead,
                    "g-grouping": GGroupingHead, "c-grouping": CGroupingHead, "deml": DeMLHead,
                    "bilinear": SecondOrderHead, "jcf": JCFHead}.items():
    HEADS.register(_name, _cls)

head_class = HEADS.get
"""The ``Head`` subclass named ``name``; an unknown name is refused with the nearest valid one."""
check_head_options = HEADS.check
"""The class of head ``name`` once every option is known (config validation)."""


def build_head(name: str, backbone: Backbone, embedding_dim: int, options: dict[str, Any] | None = None) -> Head:
    """Build head ``name`` on ``backbone``; an unknown option is named with the head's valid ones."""
    return check_head_options(name, options).from_backbone(backbone, embedding_dim, **dict(options or {}))
