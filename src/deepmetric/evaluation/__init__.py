"""Evaluation: exact blocked kNN, retrieval metrics and the split evaluator."""

from .knn import knn
from .metrics import nmi_score, retrieval_metrics

__all__ = ["embed_table", "evaluate", "knn", "nmi_score", "retrieval_metrics", "split_metrics"]


def __getattr__(name: str):
    """The evaluator (which needs the data pipeline, hence torchvision) is imported on first use, so that
    metrics of precomputed embeddings start quickly."""
    if name in ("embed_table", "evaluate", "split_metrics"):
        from . import evaluator

        return getattr(evaluator, name)
    raise AttributeError(f"module 'deepmetric.evaluation' has no attribute '{name}'")
