"""Building blocks of high-order pooling: moment approximations, sketches, matrix normalisations."""

from .moments import MODES, HighOrderMoments, rademacher

__all__ = ["MODES", "HighOrderMoments", "rademacher"]
