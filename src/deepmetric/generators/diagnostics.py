"""MIRAGE's pictures (thesis Fig. 6.3): a 2-D map of the prototypes, and the 2-D latent space itself.

Rendered with matplotlib's ``Figure`` on the Agg canvas (no pyplot, no global backend state).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure

from ..io.files import atomic_write_bytes
from ..render import figure_png, project_2d


def _save(figure: Figure, path: Path) -> None:
    atomic_write_bytes(path, figure_png(figure, dpi=110, tight=True))


def prototype_map(path: Path, prototypes: torch.Tensor, num_training: int, method: str, seed: int,
                  fraction: float) -> None:
    """Fig. 6.3a: training prototypes (green) and virtual prototypes (grey) in a 2-D projection."""
    xy = project_2d(prototypes.numpy().astype(np.float64), method, seed)
    figure = Figure(figsize=(6, 6))
    ax = figure.add_subplot()
    ax.scatter(xy[num_training:, 0], xy[num_training:, 1], s=18, c="0.6", marker="x",
               label=f"virtual prototypes ({len(xy) - num_training})")
    ax.scatter(xy[:num_training, 0], xy[:num_training, 1], s=22, c="tab:green", marker="x",
               label=f"training prototypes ({num_training})")
    if prototypes.shape[1] <= 2:
        name = "the 2-D latent space itself"
    else:
        name = "t-SNE" if method == "tsne" and len(xy) >= 8 else "PCA"
    ax.set_title(f"MIRAGE prototypes ({name}); nearest prototype is virtual for {100 * fraction:.0f}% "
                 "of training prototypes", fontsize=9)
    ax.legend(loc="best", fontsize=8)
    ax.set_xticks([])
    ax.set_yticks([])
    _save(figure, path)


def latent_2d_picture(path: Path, embeddings: np.ndarray, labels: np.ndarray, prototypes: np.ndarray,
                      num_training: int, generated: np.ndarray, generated_rows: np.ndarray,
                      names: list[str] | None = None) -> None:
    """Fig. 6.3b: a 2-D latent space without l2. Real training examples are drawn as their class name (digits),
    training prototypes as large crosses in their class colour, virtual prototypes as pale crosses and the
    examples generated from them as pale dots."""
    import matplotlib

    colours = matplotlib.colormaps["tab10"]
    names = names or [str(c) for c in range(num_training)]
    figure = Figure(figsize=(7, 7))
    ax = figure.add_subplot()
    virtual = generated_rows >= num_training
    ax.scatter(generated[virtual, 0], generated[virtual, 1], s=6, c="0.8", label="generated, virtual classes")
    ax.scatter(prototypes[num_training:, 0], prototypes[num_training:, 1], s=60, c="0.55", marker="x",
               linewidths=1.5, label="virtual prototypes")
    for c in range(num_training):
        mine = labels == c
        colour = colours(c % 10)
        for x, y in embeddings[mine][:200]:
            ax.text(x, y, names[c], color=colour, fontsize=6, ha="center", va="center", alpha=0.8)
        ax.scatter(prototypes[c, 0], prototypes[c, 1], s=140, color=colour, marker="x", linewidths=3)
    everything = np.concatenate([embeddings, prototypes, generated])
    lo, hi = np.percentile(everything, 1, axis=0), np.percentile(everything, 99, axis=0)
    pad = 0.1 * (hi - lo + 1e-6)
    ax.set_xlim(lo[0] - pad[0], hi[0] + pad[0])
    ax.set_ylim(lo[1] - pad[1], hi[1] + pad[1])
    ax.set_title("MIRAGE, 2-D latent space (no l2): training examples (digits), prototypes (x), virtual (grey)",
                 fontsize=9)
    ax.legend(loc="best", fontsize=8)
    _save(figure, path)
