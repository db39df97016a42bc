"""``data.color_jitter``: torchvision's ``ColorJitter`` drawn from the sample's seed, run on a batch at once.

``ColorJitter(brightness=b, contrast=c, saturation=s, hue=h)`` (torchvision ``transforms.v2``) draws, per image, an
order of its four operations (a random permutation) and one factor per operation whose strength is not zero:
brightness, contrast and saturation from ``U[max(0, 1 - x), 1 + x]``, hue from ``U[-h, h]``; then, in that order, on
an image in [0, 1] (``Y = 0.2989 R + 0.587 G + 0.114 B``, the ITU-R 601 luma torchvision's grayscale uses):

- brightness ``f``: ``clamp(f x, 0, 1)``;
- contrast ``f``: ``clamp(f x + (1 - f) mean(Y), 0, 1)``, the mean over the whole image (padding included);
- saturation ``f``: ``clamp(f x + (1 - f) Y, 0, 1)``, pixel by pixel;
- hue ``f``: the image in HSV, ``H <- (H + f) mod 1``, back to RGB (done without the saturation: the chroma
  ``max - min``, which it keeps, is all that is needed).

``draw_jitter`` makes those draws from the sample's own generator after the crop's (``TrainTransform`` and
``batched_transforms.draw_crop``), and draws nothing when every strength is zero, so a run without jitter sees the
pixels it saw before the option existed. ``color_jitter`` runs a batch's draws together: for each of the four
places of the order and each operation, one operation on the samples that have it there (no sample's value is read
back from the device; the groups' indices and factors go to it in two small copies). ``TrainTransform`` calls it on
one image, ``data.cache`` on a batch on the training device: the same function, so the same pixels for the same
crops. Both round the result to 8-bit levels, as a uint8 pipeline keeps an image, so the loaders' uint8 batches
still carry it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .jitter_options import is_on

LUMA = (0.2989, 0.587, 0.114)
"""torchvision's ``rgb_to_grayscale`` weights of R, G and B."""


@dataclass(frozen=True)
class JitterDraw:
    """One image's colour jitter: ``factors[k]`` of ``jitter_options.OPERATIONS[k]`` (None: not applied, its
    strength being zero), applied in the order ``order`` (a permutation of 0..3)."""

    factors: tuple[float | None, float | None, float | None, float | None]
    order: tuple[int, int, int, int]


def draw_jitter(rng: np.random.Generator, strengths: Sequence[float]) -> JitterDraw | None:
    """The draws of ``ColorJitter(*strengths)`` from ``rng``, in its order: the permutation, then each factor whose
    strength is not zero (brightness, contrast, saturation ``U[max(0, 1 - x), 1 + x]``, hue ``U[-x, x]``); None,
    drawing nothing, when every strength is zero."""
    if not is_on(strengths):
        return None
    order = tuple(int(k) for k in rng.permutation(4))
    factors: list[float | None] = []
    for k, strength in enumerate(strengths):
        if strength == 0:
            factors.append(None)
        elif k == 3:
            factors.append(float(rng.uniform(-strength, strength)))
        else:
            factors.append(float(rng.uniform(max(0.0, 1 - strength), 1 + strength)))
    return JitterDraw(tuple(factors), order)  # type: ignore[arg-type]


def luma(images: torch.Tensor) -> torch.Tensor:
    """(B, 1, H, W): ``0.2989 R + 0.587 G + 0.114 B`` of (B, 3, H, W) images."""
    r, g, b = images.unbind(dim=1)
    return (r * LUMA[0] + g * LUMA[1] + b * LUMA[2]).unsqueeze(1)


def blend(images: torch.Tensor, other: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``clamp(f x + (1 - f) other, 0, 1)`` with ``factor`` (B,) one per image."""
    f = factor.view(-1, 1, 1, 1)
    return (images * f + other * (1 - f)).clamp_(0, 1)


def adjust_brightness(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``clamp(f x, 0, 1)``, one factor per image."""
    return (images * factor.view(-1, 1, 1, 1)).clamp_(0, 1)


def adjust_contrast(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Each image blended with the mean of its luma."""
    return blend(images, luma(images).mean(dim=(1, 2, 3), keepdim=True), factor)


def adjust_saturation(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Each pixel blended with its own luma."""
    return blend(images, luma(images), factor)


def sextant_and_chroma(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(6 H, V, C) of (B, 3, H, W) RGB images in [0, 1], each (B, H, W): the value ``V = max``, the chroma
    ``C = max - min`` and the hue in sextants, ``6 H`` in [0, 6): the largest channel's sextant (R before G before B
    on ties) plus the other two's difference over ``C``; 0 where ``C = 0`` (grey). HSV's saturation is ``C / V``."""
    r, g, b = images.unbind(dim=1)
    low, value = torch.aminmax(images, dim=1)
    chroma = value - low
    grey = chroma == 0
    safe = torch.where(grey, torch.ones_like(chroma), chroma)
    sextant = torch.where(value == r, (g - b) / safe,
                          torch.where(value == g, (b - r) / safe + 2, (r - g) / safe + 4))
    return torch.where(grey, torch.zeros_like(sextant), sextant.remainder(6.0)), value, chroma


def from_sextant_and_chroma(sextant: torch.Tensor, value: torch.Tensor, chroma: torch.Tensor) -> torch.Tensor:
    """The inverse of ``sextant_and_chroma`` (any real ``sextant``, read modulo 6): channel ``n`` (5 for R, 3 for G,
    1 for B) is ``V - C clamp(min(k, 4 - k), 0, 1)`` with ``k = (n + 6 H) mod 6``."""
    channels = []
    for n in (5.0, 3.0, 1.0):
        k = (sextant + n).remainder(6.0)
        channels.append(value - chroma * torch.minimum(k, 4 - k).clamp(0, 1))
    return torch.stack(channels, dim=1)


def adjust_hue(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Each image's hue turned by its ``factor`` (in [-0.5, 0.5]) of the colour wheel: ``H <- (H + f) mod 1`` in HSV,
    the value and saturation kept (so the largest channel and the chroma)."""
    sextant, value, chroma = sextant_and_chroma(images)
    return from_sextant_and_chroma(sextant + 6 * factor.view(-1, 1, 1), value, chroma).clamp_(0, 1)


ADJUST = (adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue)
"""The operation of each number of ``JitterDraw.order``."""


def color_jitter(images: torch.Tensor, draws: Sequence[JitterDraw | None]) -> torch.Tensor:
    """(B, 3, H, W) float in [0, 1]: each image jittered by its draw (None: left as it is), in its draw's order;
    ``torchvision.transforms.v2.ColorJitter`` with those draws, up to float rounding. The groups of samples are
    known on the host; their indices and factors go to the device in one copy each."""
    groups: list[tuple[int, list[int]]] = []  # (operation, samples), place by place of the order
    indices: list[int] = []
    factors: list[float] = []
    for place in range(4):
        for operation in range(4):
            samples = [b for b, draw in enumerate(draws) if draw is not None and draw.order[place] == operation
                       and draw.factors[operation] is not None]
            if samples:
                groups.append((operation, samples))
                indices.extend(samples)
                factors.extend(draws[b].factors[operation] for b in samples)  # type: ignore[union-attr, misc]
    if not groups:
        return images
    device = images.device
    index = torch.tensor(indices, dtype=torch.int64).to(device, non_blocking=True)
    factor = torch.tensor(factors, dtype=torch.float32).to(device, non_blocking=True)
    out, start = images.clone(), 0
    for operation, samples in groups:
        rows = index[start:start + len(samples)]
        out.index_copy_(0, rows, ADJUST[operation](out.index_select(0, rows), factor[start:start + len(samples)]))
        start += len(samples)
    return out


def to_levels(images: torch.Tensor) -> torch.Tensor:
    """Float images in [0, 1] rounded to the 256 levels of an 8-bit image: ``round(255 x)`` (float, 0..255)."""
    return images.mul(255).round_().clamp_(0, 255)
