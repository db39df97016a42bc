"""``TrainTransform`` for a whole batch at once, as tensor operations on the training device (``data.cache``).

The draws are ``TrainTransform``'s, from the same per-sample seed and in the same order (``draw_crop``: the scale
``U[lo, hi]``, the crop's top and left, the flip), computed from the shape of the image as the reader gives it, so a
sample gets the same resized size, crop position and flip with or without the cache, and a resumed run sees the
batches of an uninterrupted one.

The pixels: the resize, the black padding, the crop and the flip of one image are together a linear map that is
separable by axis, ``crop = Wy @ image @ Wx^T`` with ``Wy`` (size x H) and ``Wx`` (size x W); ``resampling_weights``
builds each row as torch's antialiased bilinear resize (``interpolate(..., antialias=True)``, what
``torchvision``'s ``resize`` runs) does for the output row it lands on: a triangle filter widened by the scale when
shrinking, clamped at the image's edges and normalised; a row that lands on the padding is zero (black), and the
flip reverses the rows of ``Wx``. A batch is then two batched matrix products over images zero-padded to the
batch's largest, rounded to 8-bit levels as the uint8 resize is; the colour jitter, when on, then runs on the batch
(``transforms.jitter_levels``, the function ``TrainTransform`` runs on one crop) and rounds to levels again.

What is exactly equal and what is not: the draws are identical; from an image kept at the reader's size (every
image whose longer side is at most ``cached_size``'s limit) the crop equals ``TrainTransform``'s up to the rounding
of torch's fixed-point uint8 resize (at most one level of 255, tested). An image larger than that limit is kept
pre-resized (antialiased) to the largest size the augmentation can ask for, so its crops are resized twice, both
times antialiased, where ``TrainTransform`` resizes once from the full image: a slightly softer image, the same
distribution of scales, positions and flips (tested on mean images).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torchvision.transforms.v2 import functional as F

from .color_jitter import JitterDraw, draw_jitter
from .jitter_options import check_strengths
from .resizing import TRAIN_PAD_MODES
from .transforms import jitter_levels, levels_to_unit, to_tensor


@dataclass(frozen=True)
class CropDraw:
    """One sample's augmentation: the image resized to ``height`` x ``width``; output pixel (i, j) of the crop is
    resized pixel (i + ``row``, j + ``column``), black where that lies outside the resized image; ``flip``; then
    the colour ``jitter`` (None: none)."""

    height: int
    width: int
    row: int
    column: int
    flip: bool
    jitter: JitterDraw | None = None


def draw_crop(seed: int, height: int, width: int, size: int, resize_range: tuple[float, float], flip: bool,
              pad: str, jitter: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)) -> CropDraw:
    """``TrainTransform``'s draws for an image of ``height`` x ``width`` from ``seed``, in its order: the longer
    side ``max(1, round(U[lo, hi] * size))``, the crop's top and left on the padded canvas, the flip, then the
    colour jitter of strengths ``jitter`` (``color_jitter.draw_jitter``)."""
    rng = np.random.default_rng(seed)
    lo, hi = resize_range
    longer = max(1, round(rng.uniform(lo, hi) * size))
    canvas = max(size, longer) if pad == "square" else size
    if pad == "stretch":
        resized_h = resized_w = longer
    else:
        scale = longer / max(height, width)
        resized_h, resized_w = max(1, round(height * scale)), max(1, round(width * scale))
    canvas_h, canvas_w = max(resized_h, canvas), max(resized_w, canvas)  # transforms._pad_to
    top = int(rng.integers(0, canvas_h - size + 1))
    left = int(rng.integers(0, canvas_w - size + 1))
    flipped = bool(flip and rng.random() < 0.5)
    return CropDraw(resized_h, resized_w, top - (canvas_h - resized_h) // 2, left - (canvas_w - resized_w) // 2,
                    flipped, draw_jitter(rng, jitter))


def largest_side(size: int, resize_range: tuple[float, float]) -> int:
    """The longest side the augmentation can resize an image to: ``ceil(hi * size)``."""
    return max(1, math.ceil(resize_range[1] * size))


def cached_size(height: int, width: int, size: int, resize_range: tuple[float, float], pad: str) -> tuple[int, int]:
    """The size the cache keeps an image of ``height`` x ``width`` at: unchanged when no side exceeds
    ``largest_side``; else shrunk so that it does not, keeping the aspect ratio (each side as ``TrainTransform``
    rounds it) or, with ``pad="stretch"`` (both sides resized to the drawn length), each side on its own."""
    limit = largest_side(size, resize_range)
    if pad == "stretch":
        return min(height, limit), min(width, limit)
    if max(height, width) <= limit:
        return height, width
    scale = limit / max(height, width)
    return max(1, round(height * scale)), max(1, round(width * scale))


def cache_image(image: np.ndarray, size: int, resize_range: tuple[float, float], pad: str) -> torch.Tensor:
    """(3, h, w) uint8: ``image`` (as the reader gives it) at ``cached_size``, shrunk with the antialiased resize
    ``TrainTransform`` uses."""
    tensor = to_tensor(image)
    shape = cached_size(tensor.shape[1], tensor.shape[2], size, resize_range, pad)
    return tensor if tuple(tensor.shape[1:]) == shape else F.resize(tensor, list(shape), antialias=True)


def filter_taps(sources: Sequence[int], resized: Sequence[int]) -> int:
    """The most source pixels one output pixel of ``resampling_weights`` can weigh, for these (source, resized)
    lengths of one axis: ``ceil(2 x the widest support) + 2``, the support being ``source / resized`` when shrinking
    and 1 when enlarging. Computed on the host from the lengths the host knows: read from the device's tensors it
    would make the host wait for the device (for everything queued before, the training step's kernels included)."""
    support = max(max(s / r, 1.0) for s, r in zip(sources, resized, strict=True))
    return int(math.ceil(2 * support)) + 2


def resampling_weights(source: torch.Tensor, resized: torch.Tensor, offset: torch.Tensor, size: int,
                       length: int, taps: int) -> torch.Tensor:
    """(B, size, length) float32: row i of sample b weighs the ``source[b]`` pixels of one axis (zero beyond it, up
    to ``length``) into crop pixel i, which is pixel ``i + offset[b]`` of that axis resized to ``resized[b]``, as
    torch's antialiased bilinear resize does (``upsample_bilinear2d_aa``: centre ``scale (i + 1/2)``, support and
    filter width ``scale`` when shrinking, 1 when enlarging, edges clamped, weights normalised); zero rows where
    the crop pixel lies on the black padding. ``source``, ``resized``, ``offset``: (B,) int64; ``taps``: at least
    ``filter_taps`` of their lengths. Nothing is read back from the device."""
    device = source.device
    src, out = source.double()[:, None], resized.double()[:, None]  # (B, 1)
    index = offset[:, None] + torch.arange(size, device=device)  # (B, size): the pixel of the resized axis
    inside = (index >= 0) & (index < resized[:, None])
    scale = src / out
    support = torch.where(scale >= 1, scale, torch.ones_like(scale))
    inverse = torch.where(scale >= 1, 1 / scale, torch.ones_like(scale))
    centre = scale * (index.double() + 0.5)  # (B, size)
    first = torch.clamp(torch.trunc(centre - support + 0.5), min=0)
    end = torch.minimum(torch.trunc(centre + support + 0.5), src)
    # only the window [first, end) of each row can be nonzero: its at most ``taps`` pixels, then placed in the row
    pixel = first[..., None] + torch.arange(taps, device=device, dtype=torch.float64)  # (B, size, taps)
    weights = torch.clamp(1 - ((pixel - centre[..., None] + 0.5) * inverse[..., None]).abs(), min=0)
    weights = weights * (pixel < end[..., None])
    total = weights.sum(-1, keepdim=True)
    weights = torch.where(total > 0, weights / torch.where(total > 0, total, torch.ones_like(total)), 0)
    weights = (weights * inside[..., None]).float()
    # positions past the row's end hold zero weights: clamped onto the last pixel, they add nothing to it
    columns = pixel.long().clamp_(max=length - 1)
    return torch.zeros(*weights.shape[:2], length, device=device).scatter_add_(2, columns, weights)


class BatchedTrainTransform:
    """``TrainTransform(size, resize_range, flip, pad, color_jitter=...)`` over a batch of cached uint8 images
    (module docstring)."""

    def __init__(self, size: int, resize_range: tuple[float, float] = (0.8, 1.8), flip: bool = True,
                 pad: str = "size", color_jitter: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)):
        if pad not in TRAIN_PAD_MODES:
            raise ValueError(f"pad must be one of {TRAIN_PAD_MODES}, got '{pad}'")
        low, high = resize_range  # a list from a config file becomes a tuple
        self.size, self.resize_range, self.flip, self.pad = size, (low, high), flip, pad
        self.color_jitter = check_strengths(color_jitter)

    def draws(self, shapes: Sequence[tuple[int, int]], seeds: Sequence[int]) -> list[CropDraw]:
        """Each sample's draws, for its image's shape as read (before the cache shrank it)."""
        return [draw_crop(seed, h, w, self.size, self.resize_range, self.flip, self.pad, self.color_jitter)
                for (h, w), seed in zip(shapes, seeds, strict=True)]

    def __call__(self, images: Sequence[torch.Tensor], shapes: Sequence[tuple[int, int]], seeds: Sequence[int],
                 device: str | torch.device | None = None) -> torch.Tensor:
        """(B, 3, size, size) float in [0, 1] on ``device`` (default: the images') from ``images`` (each (3, h, w)
        uint8 as ``cached_size`` keeps it), the ``shapes`` they had as read, and one seed each."""
        device = torch.device(device) if device is not None else images[0].device
        draws = self.draws(shapes, seeds)
        height, width = max(int(i.shape[1]) for i in images), max(int(i.shape[2]) for i in images)
        if all(int(i.shape[1]) == height and int(i.shape[2]) == width for i in images):
            batch = torch.stack(list(images))  # one operation where the images share a size (emoji, icons)
        else:
            batch = torch.zeros(len(images), 3, height, width, dtype=torch.uint8, device=images[0].device)
            for k, image in enumerate(images):
                batch[k, :, :image.shape[1], :image.shape[2]] = image
        batch = batch.to(device, non_blocking=True).float()  # (B, 3, H, W)
        # the per-sample figures in one copy to the device: each operation is a host's launch on a GPU
        figures = [[int(i.shape[1]) for i in images], [d.height for d in draws], [d.row for d in draws],
                   [int(i.shape[2]) for i in images], [d.width for d in draws], [d.column for d in draws],
                   [int(d.flip) for d in draws]]
        taps_h, taps_w = filter_taps(figures[0], figures[1]), filter_taps(figures[3], figures[4])
        columns = torch.tensor(figures, dtype=torch.int64).to(device, non_blocking=True)
        source_h, resized_h, row, source_w, resized_w, column, flip = columns
        wy = resampling_weights(source_h, resized_h, row, self.size, height, taps_h)  # (B, size, H)
        wx = resampling_weights(source_w, resized_w, column, self.size, width, taps_w)  # (B, size, W)
        wx = torch.where(flip.bool()[:, None, None], wx.flip(1), wx)
        levels = (wy[:, None] @ batch @ wx.transpose(1, 2)[:, None]).round_().clamp_(0, 255)  # (B, 3, size, size)
        jitters = [draw.jitter for draw in draws]
        if any(jitter is not None for jitter in jitters):  # as TrainTransform does to its crop
            levels = jitter_levels(levels, jitters)
        return levels_to_unit(levels)
