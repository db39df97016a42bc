"""Shared drawing plumbing, below every package that draws (viz, report, generators, studies): a matplotlib
``Figure`` to PNG bytes, and a 2-D projection of embeddings.

Figures are built with ``matplotlib.figure.Figure`` on the Agg canvas: no pyplot, no global backend state,
no display needed, nothing to close.
"""

from __future__ import annotations

import io

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text


def plain_text(figure: Figure) -> Figure:
    """Turn matplotlib's math parsing off in every text of ``figure`` but its tick labels (a log axis writes its
    own ``$2^{3}$``): titles, legends and labels quote file, class and variant names, and a ``$…$`` in one made
    matplotlib's math parser fail the whole figure."""
    ticks = {id(label) for axes in figure.axes for axis in (axes.xaxis, axes.yaxis)
             for label in axis.get_ticklabels(which="both")}
    for text in figure.findobj(Text):
        if id(text) not in ticks:
            text.set_parse_math(False)
    return figure


def figure_png(figure: Figure, dpi: float | None = None, tight: bool = False) -> bytes:
    """The figure rendered as PNG bytes (``tight``: crop to the drawn area), its texts drawn as written
    (``plain_text``)."""
    FigureCanvasAgg(figure)
    plain_text(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi or figure.dpi, bbox_inches="tight" if tight else None)
    return buffer.getvalue()


SINGLE_THREAD_TSNE_UP_TO = 5000
"""Points up to which t-SNE runs on one thread: the report's and MIRAGE's maps (a few hundred points) took 35 s on a
loaded 2-core machine with OpenMP's threads against 0.5 s with one."""


def projection_method(points: np.ndarray, method: str = "tsne") -> str:
    """The projection ``project_2d`` uses for ``points``: ``method`` where the points allow it, ``pca`` where t-SNE
    cannot run (fewer than 8 distinct points: scikit-learn's Barnes-Hut t-SNE divides by zero, and has crashed the
    process, on coincident points), ``none`` where there is nothing to project (no point, a non-finite value, or
    every point the same: a collapsed embedding)."""
    if len(points) == 0 or not np.isfinite(points).all():
        return "none"
    distinct = len(np.unique(points.astype(np.float32), axis=0))
    if distinct < 2:
        return "none"
    return "pca" if method == "tsne" and distinct < 8 else method


def project_2d(points: np.ndarray, method: str = "tsne", seed: int = 0, metric: str = "euclidean") -> np.ndarray:
    """(N, D) -> (N, 2) by t-SNE (PCA-initialised, perplexity min(30, (N - 1) / 3)) or PCA, as
    ``projection_method`` chooses: PCA where t-SNE cannot run, all zeros where the points coincide (or are not
    finite); D <= 2 is returned as is (padded to 2 columns)."""
    used = projection_method(points, method)
    if used == "none":
        return np.zeros((len(points), 2))
    if points.shape[1] <= 2:
        return np.pad(points, ((0, 0), (0, 2 - points.shape[1])))
    if used == "tsne":
        from sklearn.manifold import TSNE
        from threadpoolctl import threadpool_limits

        perplexity = float(min(30.0, (len(points) - 1) / 3))
        tsne = TSNE(2, perplexity=perplexity, init="pca", metric=metric, random_state=seed)
        threads = 1 if len(points) <= SINGLE_THREAD_TSNE_UP_TO else None  # None: no limit
        with threadpool_limits(threads):  # a few hundred points: threads only contend (35 s against 0.5 s, busy CPU)
            return tsne.fit_transform(points)
    from sklearn.decomposition import PCA

    return PCA(2, random_state=seed).fit_transform(points)
