"""The resizing choices of ``data/transforms.py`` (``data.train_pad``, ``data.test_resize``), in a module without
torch so that the config can check them without importing the data pipeline."""

TRAIN_PAD_MODES = ("size", "square", "stretch")
"""``data.train_pad``: before the random crop, pad the resized image to image_size (``size``), its shorter side
to the longer one (``square``, ABE), or resize both sides to the drawn length (``stretch``)."""
TEST_RESIZE_MODES = ("resize", "resize_crop", "pad_crop", "stretch_crop", "short_crop")
"""``data.test_resize``: see ``DataConfig.test_resize``."""
