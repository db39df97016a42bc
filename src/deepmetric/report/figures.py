"""The report's figures, each returned as PNG bytes: training curves, the Recall@K curve, the retrieval grid
and the 2-D map of test embeddings."""

from __future__ import annotations

import io
from typing import Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from PIL import Image, ImageDraw

from ..data.table import RetrievalTable
from ..evaluation.knn import knn
from ..render import figure_png, project_2d, projection_method
from ..runs.folder import AMP_LOG_KEYS


def _png(figure: Figure) -> bytes:
    figure.tight_layout()
    return figure_png(figure)


def loss_terms(steps: list[dict[str, Any]]) -> list[str]:
    """The keys of the training records that are the loss or its terms (not the step, rate, speed or fp16's scaler
    figures); a term that equals the total at every step (a single-term objective) would hide under its line."""
    terms = [k for k in (steps[0] if steps else {}) if k not in ("step", "lr", "images_per_s", *AMP_LOG_KEYS)]
    return [k for k in terms if k == "loss" or any(r.get(k) != r["loss"] for r in steps)]


def training_curves(log: list[dict[str, Any]]) -> bytes:
    """Every logged loss term against the step, and the validation metrics beside them."""
    steps = [r for r in log if "loss" in r]
    validation = [r for r in log if r.get("split") == "val"]
    terms = loss_terms(steps)
    figure = Figure(figsize=(11 if validation else 6, 3.6), dpi=100)
    axes = figure.subplots(1, 2 if validation else 1, squeeze=False)
    for term in terms:
        axes[0, 0].plot([r["step"] for r in steps], [r[term] for r in steps], label=term)
    axes[0, 0].set(xlabel="step", ylabel="loss (unweighted terms)", title="training")
    axes[0, 0].legend()
    axes[0, 0].grid(alpha=0.3)
    if validation:
        for key in ("recall@1", "map@r", "r_precision"):
            if key in validation[0]:
                axes[0, 1].plot([r["step"] for r in validation], [100 * r[key] for r in validation], "o-",
                                label=key)
        axes[0, 1].set(xlabel="step", ylabel="%", title="validation")
        axes[0, 1].legend()
        axes[0, 1].grid(alpha=0.3)
    return _png(figure)


def recall_curve(curves: dict[str, dict[str, float]]) -> bytes:
    """Recall@K against K (log scale) for each named set of metrics."""
    figure = Figure(figsize=(6, 3.6), dpi=100)
    axis = figure.subplots()
    for name, metrics in curves.items():
        ks = sorted(int(k.split("@")[1]) for k in metrics if k.startswith("recall@"))
        axis.plot(ks, [100 * metrics[f"recall@{k}"] for k in ks], "o-", label=name)
    axis.set_xscale("log", base=2)
    axis.set(xlabel="K", ylabel="Recall@K (%)", title="test Recall@K")
    axis.legend()
    axis.grid(alpha=0.3)
    return _png(figure)


def _thumbnail(image: np.ndarray, size: int, frame: tuple[int, int, int] | None) -> Image.Image:
    tile = Image.fromarray(image).convert("RGB")
    tile.thumbnail((size, size))
    canvas = Image.new("RGB", (size + 8, size + 8), (255, 255, 255))
    canvas.paste(tile, (4 + (size - tile.width) // 2, 4 + (size - tile.height) // 2))
    if frame:
        ImageDraw.Draw(canvas).rectangle([0, 0, size + 7, size + 7], outline=frame, width=4)
    return canvas


def retrieval_grid(table: RetrievalTable, embeddings: np.ndarray, queries: int = 8, top: int = 8,
                   seed: int = 0, size: int = 72) -> bytes:
    """Random test queries (left, black frame) with their top results: green when of the query's class, red
    otherwise. The query's own row is excluded."""
    import torch

    x = torch.nn.functional.normalize(torch.as_tensor(embeddings).float(), dim=1)
    rows = np.random.default_rng(seed).choice(len(table), size=min(queries, len(table)), replace=False)
    _, neighbours = knn(x[rows], x, min(top, len(table) - 1), torch.as_tensor(rows), engine="torch")
    cell = size + 8
    sheet = Image.new("RGB", ((top + 1) * cell + 12, len(rows) * cell), (255, 255, 255))
    for r, row in enumerate(rows):
        sheet.paste(_thumbnail(table.image(int(row)), size, (0, 0, 0)), (0, r * cell))
        for c, found in enumerate(neighbours[r].tolist()):
            right = table.labels[found] == table.labels[row]
            sheet.paste(_thumbnail(table.image(found), size, (30, 170, 60) if right else (220, 40, 40)),
                        ((c + 1) * cell + 12, r * cell))
    buffer = io.BytesIO()
    sheet.save(buffer, format="PNG")
    return buffer.getvalue()


class FigureSkipped(Exception):
    """A figure that cannot be drawn from these inputs; the message says why (the report shows it instead)."""


def embedding_map(embeddings: np.ndarray, labels: np.ndarray, max_classes: int = 12, seed: int = 0,
                  class_names: dict[int, str] | None = None) -> bytes:
    """t-SNE (cosine) of the test embeddings of up to ``max_classes`` random classes, coloured by class (PCA
    where t-SNE cannot run; ``FigureSkipped`` where the embeddings coincide)."""
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    shown = rng.choice(classes, size=min(max_classes, len(classes)), replace=False)
    keep = np.isin(labels, shown)
    x, y = embeddings[keep], labels[keep]
    method = projection_method(x, "tsne")
    if method == "none":
        raise FigureSkipped(f"the {len(x)} test embeddings of the {len(shown)} classes shown coincide or are not "
                            "finite (a collapsed model): there is nothing to map")
    points = project_2d(x, method, seed, metric="cosine")
    figure = Figure(figsize=(6.5, 5), dpi=100)
    axis = figure.subplots()
    colours = matplotlib.colormaps["tab20"]
    for i, label in enumerate(sorted(shown)):
        mask = y == label
        name = (class_names or {}).get(int(label), str(label))
        axis.scatter(points[mask, 0], points[mask, 1], s=8, color=colours(i % 20), label=name)
    title = {"tsne": "t-SNE", "pca": "PCA (too few distinct points for t-SNE)"}[method]
    axis.set(title=f"test embeddings, {title} ({len(shown)} of {len(classes)} classes)", xticks=[], yticks=[])
    axis.legend(fontsize=7, markerscale=2, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return _png(figure)
