"""The heads: ``HEADS`` names every ``Head`` subclass (each registers itself at its class, ``registry.py``); a head
is built with ``Head.from_backbone``. Importing this package imports every head module, in the order ``HEADS``
lists them: the baseline first, then the papers' heads."""

from __future__ import annotations

from typing import Any

from ..backbones import Backbone
from .base import Head, HeadOutput
from .registry import HEADS

# isort: off
from . import gap, diablo, abe, dgml, grouping_baselines, deml, second_order, jcf  # noqa: F401 (each registers its heads)
# isort: on

__all__ = ["HEADS", "Head", "HeadOutput", "build_head", "check_head_options", "head_class"]

head_class = HEADS.get
"""The ``Head`` subclass named ``name``; an unknown name is refused with the nearest valid one."""
check_head_options = HEADS.check
"""The class of head ``name`` once every option is known (config validation)."""


def build_head(name: str, backbone: Backbone, embedding_dim: int, options: dict[str, Any] | None = None) -> Head:
    """Build head ``name`` on ``backbone``; an unknown option is named with the head's valid ones."""
    return check_head_options(name, options).from_backbone(backbone, embedding_dim, **dict(options or {}))
