"""Attention maps drawn over images (DGML §3.3, Figures 3 and 4), as PNG bytes.

A head's maps (P, h, w) are bilinearly upsampled to the image (eq. 10: ``A_hat = Interpolation(A)``) and
drawn over it in one colour map, on one colour scale per figure (from the figure's lowest to its highest
weight) with a colour bar as the legend, so groups can be compared by eye and the bar gives the values.
Rendering uses matplotlib's ``Figure`` with the Agg canvas directly: no pyplot, no global backend state,
no display needed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure

from ..render import figure_png

COLORMAP = "jet"
ALPHA = 0.5
TILE_INCHES = 1.6


def upsample(maps: torch.Tensor, size: tuple[int, int]) -> np.ndarray:
    """(P, h, w) maps -> (P, H, W) float array at the image size, by bilinear interpolation (eq. 10)."""
    maps = maps.detach().float().cpu()[None]
    return F.interpolate(maps, size=size, mode="bilinear", align_corners=False)[0].numpy()


def _colour_scale(maps: Sequence[np.ndarray]) -> tuple[float, float]:
    low = min(float(m.min()) for m in maps)
    high = max(float(m.max()) for m in maps)
    return low, max(high, low + 1e-6)


def _tile(axes, image: np.ndarray, overlay: np.ndarray | None, scale: tuple[float, float], title: str):
    axes.imshow(image, interpolation="bilinear")
    mappable = None
    if overlay is not None:
        mappable = axes.imshow(overlay, cmap=COLORMAP, alpha=ALPHA, vmin=scale[0], vmax=scale[1],
                               interpolation="nearest")
    axes.set_title(title, fontsize=7)
    axes.set_xticks([])
    axes.set_yticks([])
    return mappable


def image_overlays(image: np.ndarray, maps: torch.Tensor, title: str = "", part_name: str = "map") -> bytes:
    """One image (H, W, 3) in [0, 1] and its P maps (P, h, w): the image, then one overlay per map, labelled
    ``part_name`` 1..P."""
    upsampled = upsample(maps, image.shape[:2])
    scale = _colour_scale(list(upsampled))
    columns = len(upsampled) + 1
    figure = Figure(figsize=(TILE_INCHES * columns + 0.8, TILE_INCHES + 0.6))
    grid = figure.subplots(1, columns, squeeze=False)[0]
    _tile(grid[0], image, None, scale, "input")
    mappable = None
    for group, overlay in enumerate(upsampled):
        peak = float(maps[group].max())
        mappable = _tile(grid[group + 1], image, overlay, scale, f"{part_name} {group + 1} (peak {peak:.2f})")
    figure.colorbar(mappable, ax=list(grid), fraction=0.02, pad=0.01, label="attention weight")
    if title:
        figure.suptitle(title, fontsize=8)
    return figure_png(figure, dpi=100)


def top_images_grid(rows: Sequence[Sequence[tuple[np.ndarray, torch.Tensor, str]]], title: str = "",
                    part_name: str = "map") -> bytes:
    """One row per map (labelled ``part_name`` 1..P): its top images as overlays of that map (DGML Figures 3
    and 4).

    ``rows[p]`` lists ``(image (H, W, 3) in [0, 1], map (h, w), caption)``.
    """
    upsampled = [[upsample(m[None], image.shape[:2])[0] for image, m, _ in row] for row in rows]
    scale = _colour_scale([m for row in upsampled for m in row])
    columns = max(len(row) for row in rows)
    figure = Figure(figsize=(TILE_INCHES * columns + 1.2, TILE_INCHES * len(rows) + 0.6))
    grid = figure.subplots(len(rows), columns, squeeze=False)
    mappable = None
    for group, (row, maps) in enumerate(zip(rows, upsampled, strict=True)):
        for column, axes in enumerate(grid[group]):
            if column >= len(row):
                axes.set_axis_off()
                continue
            image, _, caption = row[column]
            mappable = _tile(axes, image, maps[column], scale, caption)
        grid[group][0].set_ylabel(f"{part_name} {group + 1}", fontsize=9)
    figure.colorbar(mappable, ax=grid.ravel().tolist(), fraction=0.015, pad=0.01, label="attention weight")
    if title:
        figure.suptitle(title, fontsize=9)
    return figure_png(figure, dpi=100)
