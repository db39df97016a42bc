"""deepmetric: zero-shot image retrieval by deep metric learning.

``create_model(backbone="lite0", head="gap", embedding_dim=512, pretrained=True, **head_options)``
builds an ``Embedder``; ``deepmetric.evaluation.retrieval_metrics`` computes Recall@K, MAP@R,
R-precision and NMI; ``deepmetric.data.load_dataset(spec)`` loads a data set table with its splits.

A trained run in Python (``api/``): ``deepmetric.load_run(RUN)`` returns a ``TrainedRun`` whose ``embed(images)``
gives what ``deepmetric embed`` writes; ``deepmetric.Index`` builds, extends, saves, opens and searches the indexes
``deepmetric index`` writes.

Importing deepmetric before numpy sets ``OPENBLAS_THREAD_TIMEOUT=4`` unless it is set already (see
``openblas.py``).
"""

from typing import TYPE_CHECKING

from . import openblas  # noqa: F401  (first: OpenBLAS reads its settings when numpy loads it)

if TYPE_CHECKING:  # what __getattr__ gives, for type checkers (imported on first use at run time)
    from .api import Index, TrainedRun, load_run
    from .models import Embedder, HeadOutput, create_model

__version__ = "0.1.0"
__all__ = ["Embedder", "HeadOutput", "Index", "TrainedRun", "__version__", "create_model", "load_run"]


def __getattr__(name: str) -> object:
    """The model API and the run API are imported on first use, so that ``deepmetric --help`` or ``deepmetric
    metrics`` do not pay for torch and torchvision's imports when they do not need them."""
    if name in ("Embedder", "HeadOutput", "create_model"):
        from . import models

        return getattr(models, name)
    if name in ("Index", "TrainedRun", "load_run"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'deepmetric' has no attribute '{name}'")
