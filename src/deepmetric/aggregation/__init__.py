"""Off-the-shelf (training-free) aggregation of local CNN features into image signatures."""

from .ista import ISTA, neighbour_pairs

__all__ = ["ISTA", "neighbour_pairs"]
