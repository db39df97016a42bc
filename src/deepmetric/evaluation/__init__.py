"""Evaluation: exact blocked kNN, retrieval metrics and the split evaluator."""

from .evaluator import embed_table, evaluate, split_metrics
from .knn import knn
from .metrics import nmi_score, retrieval_metrics

__all__ = ["embed_table", "evaluate", "knn", "nmi_score", "retrieval_metrics", "split_metrics"]
