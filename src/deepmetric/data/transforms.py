"""The papers' augmentation and test-time resizing, driven by an explicit per-sample seed.

Training (thesis §4.4.6; the HORDE code's ``MultiResolution`` / ``RandomCrop`` / ``HorizontalFlip``):
the longer side is resized to ``U[lo, hi] x size`` keeping the aspect ratio, a ``size x size`` crop is
taken at random (a side shorter than ``size`` is first centred on a black canvas; with ``pad="square"``,
ABE §4's preprocessing, the shorter side is padded to the longer one first, so the crop also moves across
the padding; with ``pad="stretch"``, ABE's cropped Cars-196, both sides are resized to the drawn length and
the aspect ratio is not kept), then a horizontal flip with probability 1/2, then, with ``color_jitter`` (none of
the papers uses it; off by default), torchvision's ``ColorJitter`` on the crop, rounded back to 8-bit levels
(``color_jitter.py``). Test (``TEST_RESIZE_MODES``):
resize to ``size x size`` (``resize``, the thesis), resize to ``ceil(1.144 size)`` and centre-crop ``size``
(``resize_crop``, the HORDE authors' code), scale the longer side to ``round(256/224 size)`` keeping the
aspect ratio, pad the shorter side to a square and centre-crop ``size`` (``pad_crop``, ABE §4: 256 -> 224),
resize both sides to ``round(256/224 size)`` and centre-crop ``size`` (``stretch_crop``, ABE §4 for the
cropped Cars-196: "256x256 scaled cropped images"), or scale the shorter side to ``round(256/224 size)``
keeping the aspect ratio and centre-crop ``size`` (``short_crop``: torchvision's ``Resize(256)`` +
``CenterCrop(224)``, the DGML authors' code).

Every random draw comes from the seed passed with the sample, so a batch is a pure function of the run
seed and the step: resumed runs and data-loader workers see exactly the same pixels.
Outputs are float tensors (3, size, size) in [0, 1]; the backbone's normalisation lives in the model. With
``uint8=True`` a transform stops before that last step and returns the uint8 pixels, a quarter of the bytes, for a
loader whose batches cross from its workers and onto a GPU (``torch_dataset.uint8_batches``): ``as_unit_float`` then
makes them, on the device, exactly the floats the transform would have returned. Padding is black (ABE does not say
with what it pads).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torchvision.transforms.v2 import functional as F

from .color_jitter import JitterDraw, color_jitter, draw_jitter, to_levels
from .jitter_options import check_strengths
from .resizing import TEST_RESIZE_MODES, TRAIN_PAD_MODES, resized_size, test_resize_plan


def as_unit_float(images: torch.Tensor) -> torch.Tensor:
    """A transform's uint8 output (``uint8=True``) as the float tensor in [0, 1] it returns otherwise: float32, then
    a division by 255 correctly rounded on any device (by a 0-dim tensor on the images' device: torch's CUDA kernels
    divide by a Python number as a product with its reciprocal, which differs in the last bit for some pixel values,
    so a GPU would see other inputs than the CPU's workers make); a float tensor (``data.cache``'s batches) is
    returned as it is. No value is read back from the device."""
    if images.dtype != torch.uint8:
        return images
    return levels_to_unit(images.float())


def levels_to_unit(levels: torch.Tensor) -> torch.Tensor:
    """Float 8-bit levels (0..255) divided by 255 in place, correctly rounded on any device (``as_unit_float``)."""
    return levels.div_(torch.full((), 255.0, device=levels.device))


def jitter_levels(levels: torch.Tensor, draws: Sequence[JitterDraw | None]) -> torch.Tensor:
    """(B, 3, H, W) float 8-bit levels (0..255) colour-jittered by ``draws`` (``color_jitter.color_jitter`` on them in
    [0, 1]) and rounded back to levels: what ``TrainTransform`` does to its crop and ``data.cache`` to its batch."""
    return to_levels(color_jitter(levels_to_unit(levels), draws))


def to_tensor(image: np.ndarray) -> torch.Tensor:
    """(H, W) or (H, W, 3) uint8 -> (3, H, W) uint8 tensor (grayscale repeated to 3 channels)."""
    array = np.ascontiguousarray(image)
    if array.ndim == 2:
        array = np.repeat(array[:, :, None], 3, axis=2)
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def _resize_longer(image: torch.Tensor, longer: int) -> torch.Tensor:
    height, width = image.shape[-2:]
    scale = longer / max(height, width)
    size = [max(1, round(height * scale)), max(1, round(width * scale))]
    return F.resize(image, size, antialias=True)


def _pad_to(image: torch.Tensor, size: int) -> torch.Tensor:
    """Centre ``image`` on a black canvas at least ``size`` on each side."""
    channels, height, width = image.shape
    if height >= size and width >= size:
        return image
    canvas = torch.zeros(channels, max(height, size), max(width, size), dtype=image.dtype)
    top, left = (canvas.shape[1] - height) // 2, (canvas.shape[2] - width) // 2
    canvas[:, top:top + height, left:left + width] = image
    return canvas


class TrainTransform:
    """Multi-resolution resize, random crop, optional flip and colour jitter (see the module docstring)."""

    def __init__(self, size: int, resize_range: tuple[float, float] = (0.8, 1.8), flip: bool = True,
                 pad: str = "size", uint8: bool = False,
                 color_jitter: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)):
        if pad not in TRAIN_PAD_MODES:
            raise ValueError(f"pad must be one of {TRAIN_PAD_MODES}, got '{pad}'")
        self.size = size
        self.resize_range = resize_range
        self.flip = flip
        self.pad = pad
        self.uint8 = uint8
        self.color_jitter = check_strengths(color_jitter)

    def __call__(self, image: np.ndarray, seed: int) -> torch.Tensor:
        rng = np.random.default_rng(seed)
        lo, hi = self.resize_range
        longer = max(1, round(rng.uniform(lo, hi) * self.size))
        canvas = max(self.size, longer) if self.pad == "square" else self.size
        pixels = to_tensor(image)
        resized = F.resize(pixels, [longer, longer], antialias=True) if self.pad == "stretch" else \
            _resize_longer(pixels, longer)
        tensor = _pad_to(resized, canvas)
        top = int(rng.integers(0, tensor.shape[1] - self.size + 1))
        left = int(rng.integers(0, tensor.shape[2] - self.size + 1))
        tensor = tensor[:, top:top + self.size, left:left + self.size]
        if self.flip and rng.random() < 0.5:
            tensor = tensor.flip(-1)
        jitter = draw_jitter(rng, self.color_jitter)
        if jitter is not None:  # on the crop in [0, 1], back to 8-bit levels
            tensor = jitter_levels(tensor.contiguous().float()[None], [jitter])[0].to(torch.uint8)
        return tensor.contiguous() if self.uint8 else as_unit_float(tensor)


class TestTransform:
    """Deterministic test-time resizing: ``resize``, ``resize_crop``, ``pad_crop``, ``stretch_crop`` or
    ``short_crop`` (module docstring), run as the steps of ``resizing.test_resize_plan`` (``plan``), which an
    export writes into the model's JSON."""

    def __init__(self, size: int, mode: str = "resize", uint8: bool = False):
        if mode not in TEST_RESIZE_MODES:
            raise ValueError(f"mode must be one of {TEST_RESIZE_MODES}, got '{mode}'")
        self.size = size
        self.mode = mode
        self.uint8 = uint8
        self.plan = test_resize_plan(size, mode)

    def __call__(self, image: np.ndarray, seed: int = 0) -> torch.Tensor:
        tensor = to_tensor(image)
        shape = resized_size(tensor.shape[-2], tensor.shape[-1], self.plan["resize"])
        if tuple(tensor.shape[-2:]) != shape:  # bilinear, antialiased when shrinking
            tensor = F.resize(tensor, list(shape), antialias=True)
        if self.plan["pad"]:
            tensor = _pad_to(tensor, self.plan["pad"]["size"])
        if self.plan["crop"]:
            tensor = F.center_crop(tensor, [self.plan["crop"]["size"]] * 2)
        return tensor.contiguous() if self.uint8 else as_unit_float(tensor)
