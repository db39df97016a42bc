"""Models: backbones cut into trunk and tail, heads, and the ``Embedder`` that joins them."""

from .backbones import Backbone, backbone_names, create_backbone
from .embedder import Embedder, create_model
from .heads import HEADS, Head, HeadOutput

__all__ = ["HEADS", "Backbone", "Embedder", "Head", "HeadOutput", "backbone_names", "create_backbone",
           "create_model"]
