"""``data.color_jitter``'s strengths and their check, in a module without torch so that the config can check them
without importing the data pipeline (the jitter itself: ``color_jitter.py``)."""

from collections.abc import Sequence

OPERATIONS = ("brightness", "contrast", "saturation", "hue")
"""The four operations, in the order of ``data.color_jitter``'s strengths (torchvision's ``ColorJitter(b, c, s, h)``).
"""


def check_strengths(strengths: Sequence[float]) -> tuple[float, float, float, float]:
    """``strengths`` as four floats (brightness, contrast, saturation, hue), each at least 0 and hue at most 0.5
    (ValueError naming the bad one otherwise)."""
    values = tuple(float(value) for value in strengths)
    if len(values) != len(OPERATIONS):
        raise ValueError(f"color_jitter takes 4 strengths ({', '.join(OPERATIONS)}), got {len(values)}")
    for name, value in zip(OPERATIONS, values, strict=True):
        if not value >= 0:  # NaN too
            raise ValueError(f"color_jitter's {name} must be at least 0, got {value}")
    if values[3] > 0.5:
        raise ValueError(f"color_jitter's hue must be at most 0.5 (half the colour wheel), got {values[3]}")
    return values  # type: ignore[return-value]


def is_on(strengths: Sequence[float]) -> bool:
    """Whether any strength is not zero."""
    return any(float(value) != 0 for value in strengths)
