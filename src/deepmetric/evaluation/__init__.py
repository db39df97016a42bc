"""Evaluation: exact blocked kNN, retrieval metrics and the split evaluator.

Names are imported on first use (PEP 562), so that ``deepmetric.evaluation.engines`` costs no torch and metrics of
precomputed embeddings do not import the data pipeline (torchvision).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what __getattr__ gives, for type checkers ("as": re-exported)
    from .evaluator import EmbedSettings as EmbedSettings
    from .evaluator import embed_table as embed_table
    from .evaluator import evaluate as evaluate
    from .evaluator import split_metrics as split_metrics
    from .metrics import nmi_score as nmi_score
    from .metrics import retrieval_metrics as retrieval_metrics

EXPORTS = {"nmi_score": "metrics", "retrieval_metrics": "metrics", "EmbedSettings": "evaluator",
           "embed_table": "evaluator", "evaluate": "evaluator", "split_metrics": "evaluator"}
# ``deepmetric.evaluation.knn`` is the module (``knn.knn`` the function): a lazily loaded package cannot give a
# function the name of one of its submodules, which the import system sets on the package once loaded.
__all__ = sorted(EXPORTS)


def __getattr__(name: str) -> Any:
    if name in EXPORTS:
        return getattr(importlib.import_module(f".{EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'deepmetric.evaluation' has no attribute '{name}'")
