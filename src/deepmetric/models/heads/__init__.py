"""Head registry: ``HEADS[name]`` is a ``Head`` subclass, built with ``Head.from_backbone``."""

from __future__ import annotations

from typing import Any

from ...errors import ConfigError, did_you_mean
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

HEADS: dict[str, type[Head]] = {
    "gap": GAPHead,
    "diablo": DIABLOHead,
    "abe": ABEHead,
    "mheads": MHeadsHead,
    "dgml": AGroupingHead,
    "n-grouping": NGroupingHead,
    "m-grouping": MGroupingHead,
    "g-grouping": GGroupingHead,
    "c-grouping": CGroupingHead,
    "deml": DeMLHead,
    "bilinear": SecondOrderHead,
    "jcf": JCFHead,
}


def head_class(name: str) -> type[Head]:
    if name not in HEADS:
        raise ConfigError(f"unknown head '{name}'{did_you_mean(name, HEADS)}; expected one of {', '.join(HEADS)}")
    return HEADS[name]


def check_head_options(name: str, options: dict[str, Any] | None) -> type[Head]:
    """The class of head ``name``; an unknown name or option is named with the valid ones (config validation)."""
    cls = head_class(name)
    accepted = cls.option_names()
    for key in options or {}:
        if key not in accepted:
            raise ConfigError(f"head '{name}' has no option '{key}'{did_you_mean(key, accepted)}; its options "
                              f"are: {', '.join(accepted) or 'none'}")
    return cls


def build_head(name: str, backbone: Backbone, embedding_dim: int, options: dict[str, Any] | None = None) -> Head:
    """Build head ``name`` on ``backbone``; an unknown option is named with the head's valid ones."""
    return check_head_options(name, options).from_backbone(backbone, embedding_dim, **dict(options or {}))
