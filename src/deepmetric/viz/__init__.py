"""Visualisation: attention overlays of any head that returns ``HeadOutput.attention`` (``deepmetric explain``)."""

from .explain import explain_dataset, explain_images
from .overlays import image_overlays, top_images_grid, upsample

__all__ = ["explain_dataset", "explain_images", "image_overlays", "top_images_grid", "upsample"]
