"""The resizing choices of ``data/transforms.py`` (``data.train_pad``, ``data.test_resize``), in a module without
torch so that the config can check them without importing the data pipeline."""

import math

TRAIN_PAD_MODES = ("size", "square", "stretch")
"""``data.train_pad``: before the random crop, pad the resized image to image_size (``size``), its shorter side
to the longer one (``square``, ABE), or resize both sides to the drawn length (``stretch``)."""
TEST_RESIZE_MODES = ("resize", "resize_crop", "pad_crop", "stretch_crop", "short_crop")
"""``data.test_resize``: see ``DataConfig.test_resize``."""

ABE_TEST_SCALE = 256 / 224
"""ABE §4: the longer side scaled to 256, the centre 224 cropped (``pad_crop``, ``stretch_crop``, ``short_crop``)."""
HORDE_TEST_SCALE = 1.144
"""The HORDE authors' code: resized to ``ceil(1.144 size)``, the centre ``size`` cropped (``resize_crop``)."""


def test_resize_plan(size: int, mode: str) -> dict:
    """``data.test_resize`` ``mode`` at ``data.image_size`` ``size`` as the steps ``TestTransform`` runs, in order
    (``deepmetric export`` writes them into the model's JSON, so that a caller without deepmetric repeats them):

    - ``resize``: ``fit`` ``both`` resizes both sides to ``size`` (the aspect ratio is not kept); ``longer`` /
      ``shorter`` scales that side to ``size`` keeping the aspect ratio, each side becoming
      ``max(min_side, round(side * size / fitted side))`` (``resized_size``);
    - ``pad`` (or None): centre the image on a black canvas of at least ``size`` x ``size``, at offset
      ``(size - side) // 2`` on each axis (a side already that long is not padded);
    - ``crop`` (or None): the centre ``size`` x ``size``, at offset ``round((side - size) / 2)`` on each axis (Python's
      round, halves to even, as torchvision's ``center_crop``).
    """
    if mode not in TEST_RESIZE_MODES:
        raise ValueError(f"mode must be one of {TEST_RESIZE_MODES}, got '{mode}'")
    if mode == "resize":
        return {"resize": {"fit": "both", "size": size}, "pad": None, "crop": None}
    side = math.ceil(size * HORDE_TEST_SCALE) if mode == "resize_crop" else max(size, round(size * ABE_TEST_SCALE))
    fit = {"pad_crop": {"fit": "longer", "min_side": 1}, "short_crop": {"fit": "shorter", "min_side": side}}
    return {"resize": {**fit.get(mode, {"fit": "both"}), "size": side},
            "pad": {"size": side, "fill": [0, 0, 0]} if mode == "pad_crop" else None,
            "crop": {"size": size}}


def resized_size(height: int, width: int, resize: dict) -> tuple[int, int]:
    """(height, width) that the ``resize`` step of ``test_resize_plan`` gives an image of ``height`` x ``width``."""
    target = resize["size"]
    if resize["fit"] == "both":
        return target, target
    scale = target / (max(height, width) if resize["fit"] == "longer" else min(height, width))
    return max(resize["min_side"], round(height * scale)), max(resize["min_side"], round(width * scale))
