"""Attention maps drawn over images (DGML §3.3, Figures 3 and 4), as PNG bytes.

A head's maps (P, h, w) are bilinearly upsampled to the image (eq. 10: ``A_hat = Interpolation(A)``) and
drawn over it in one colour map, on one colour scale per figure (from the figure's lowest to its highest
weight) with a colour bar as the legend, so groups can be compared by eye and the bar gives the values.
Rendering uses matplotlib's ``Figure`` with the Agg canvas directly: no pyplot, no global backend state,
no display needed. The top-images grid is laid out in inches (square panels, a band above each for its caption, a
margin for the row labels and the colour bar), and each caption is fitted to its panel's width with the renderer's
own text metrics (``fit_text``): long class names overlapped their neighbours.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.axes import Axes
from matplotlib.backend_bases import RendererBase
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.image import AxesImage

from ..render import figure_png

COLORMAP = "jet"
ALPHA = 0.5
TILE_INCHES = 1.6
CAPTION_PT = 7
CAPTION_LINES = 2
TITLE_PT = 9
TITLE_LINES = 3
LINE_SPACING = 1.2  # matplotlib's default, in font sizes


def upsample(maps: torch.Tensor, size: tuple[int, int]) -> np.ndarray:
    """(P, h, w) maps -> (P, H, W) float array at the image size, by bilinear interpolation (eq. 10)."""
    maps = maps.detach().float().cpu()[None]
    return F.interpolate(maps, size=size, mode="bilinear", align_corners=False)[0].numpy()


def _colour_scale(maps: Sequence[np.ndarray]) -> tuple[float, float]:
    low = min(float(m.min()) for m in maps)
    high = max(float(m.max()) for m in maps)
    return low, max(high, low + 1e-6)


def _tile(axes: Axes, image: np.ndarray, overlay: np.ndarray | None, scale: tuple[float, float],
          title: str) -> AxesImage | None:
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
    assert mappable is not None  # at least one map was drawn (upsample refuses P = 0)
    figure.colorbar(mappable, ax=list(grid), fraction=0.02, pad=0.01, label="attention weight")
    if title:
        figure.suptitle(title, fontsize=8)
    return figure_png(figure, dpi=100)


def fit_text(text: str, width_px: float, renderer: RendererBase, fontsize: float, lines: int) -> str:
    """``text`` wrapped to ``width_px`` (measured by ``renderer`` at ``fontsize``, drawn as plain text) on at most
    ``lines`` lines: broken at spaces, inside a word only where the word alone is too wide; where it still does
    not fit, characters are left out of its middle for an ellipsis, so that its start and its end (a class
    name's first characters, the peak weight) stay."""
    prop = FontProperties(size=fontsize)
    advances: dict[str, float] = {}

    def measured(piece: str) -> float:
        return renderer.get_text_width_height_descent(piece, prop, ismath=False)[0]

    def width(piece: str) -> float:  # the sum of each character's width, measured once (a string's took 1 ms)
        for char in set(piece) - advances.keys():
            advances[char] = measured(char)
        return sum(advances[char] for char in piece)

    for _ in range(8):  # the sum misses kerning: narrower until every line, measured whole, fits
        text_lines = _fit_lines(text, width, width_px, lines)
        if all(measured(line) <= width_px for line in text_lines):
            break
        width_px *= 0.95
    return "\n".join(text_lines)


def _fit_lines(text: str, width: Callable[[str], float], width_px: float, lines: int) -> list[str]:
    """``fit_text``'s lines, with ``width`` measuring a piece of text."""

    def wrapped(whole: str) -> list[str]:
        out: list[str] = []
        for word in whole.split(" "):
            if out and width(f"{out[-1]} {word}") <= width_px:
                out[-1] = f"{out[-1]} {word}"
                continue
            piece = ""
            for char in word:  # a word wider than the panel is broken where it reaches the edge
                if piece and width(piece + char) > width_px:
                    out.append(piece)
                    piece = ""
                piece += char
            out.append(piece)
        return out

    fitted = wrapped(text)
    if len(fitted) <= lines:
        return fitted
    low, high = 0, len(text)  # the most characters kept around the ellipsis that still fit
    while low < high:
        keep = (low + high + 1) // 2
        if len(wrapped(_middle_cut(text, keep))) <= lines:
            low = keep
        else:
            high = keep - 1
    return wrapped(_middle_cut(text, low))


def _middle_cut(text: str, keep: int) -> str:
    """``text`` with its middle replaced by an ellipsis, ``keep`` of its characters left (more of its end)."""
    head = keep // 2
    return text[:head] + "…" + text[len(text) - (keep - head):]


def top_images_grid(rows: Sequence[Sequence[tuple[np.ndarray, torch.Tensor, str]]], title: str = "",
                    part_name: str = "map") -> bytes:
    """One row per map (labelled ``part_name`` 1..P): its top images as overlays of that map (DGML Figures 3
    and 4).

    ``rows[p]`` lists ``(image (H, W, 3) in [0, 1], map (h, w), caption)``: each caption is fitted to its panel
    (``fit_text``, two lines at most), the title to the figure's width.
    """
    upsampled = [[upsample(m[None], image.shape[:2])[0] for image, m, _ in row] for row in rows]
    scale = _colour_scale([m for row in upsampled for m in row])
    columns = max(len(row) for row in rows)
    tile, gap = TILE_INCHES, 0.12  # a square panel (the network's square input), the space between two
    caption_band = (CAPTION_LINES * LINE_SPACING * CAPTION_PT + 6) / 72  # the captions' lines and their pad
    left, right, bottom = 0.4, 1.0, 0.1  # row labels; the colour bar, its ticks and label
    width = left + columns * tile + (columns - 1) * gap + right
    figure = Figure(figsize=(width, 1.0))  # its height once the title is fitted to its width
    renderer = FigureCanvasAgg(figure).get_renderer()
    title = fit_text(title, (width - 0.2) * figure.dpi, renderer, TITLE_PT, TITLE_LINES) if title else ""
    title_band = ((title.count("\n") + 1) * LINE_SPACING * TITLE_PT + 12) / 72 if title else 0.1
    height = title_band + len(rows) * (caption_band + tile) + bottom
    figure.set_size_inches(width, height)
    mappable = None
    for group, (row, maps) in enumerate(zip(rows, upsampled, strict=True)):
        y = height - title_band - (group + 1) * (caption_band + tile)
        for column, (image, _, caption) in enumerate(row):
            x = left + column * (tile + gap)
            axes = figure.add_axes((x / width, y / height, tile / width, tile / height))
            fitted = fit_text(caption, tile * figure.dpi, renderer, CAPTION_PT, CAPTION_LINES)
            mappable = _tile(axes, image, maps[column], scale, fitted)
            axes.set_title(fitted, fontsize=CAPTION_PT, pad=3)
            if column == 0:
                axes.set_ylabel(f"{part_name} {group + 1}", fontsize=9)
    grid_top = height - title_band - caption_band
    colour_bar = figure.add_axes(((left + columns * tile + (columns - 1) * gap + 0.15) / width, bottom / height,
                                  0.12 / width, (grid_top - bottom) / height))
    if mappable is not None:  # None only when no row holds an image: nothing to scale
        figure.colorbar(mappable, cax=colour_bar, label="attention weight")
    if title:
        figure.suptitle(title, fontsize=TITLE_PT, y=1 - 0.06 / height, va="top")
    return figure_png(figure, dpi=100)
