"""Evaluating the embeddings a head or an objective computes beside the model's own (e.g. DeML's per-scale
root-learners, HORDE's per-order embeddings).

``embed_with_objective`` embeds a split with the model and every auxiliary embedding of the head
(``Head.auxiliary_embeddings``) and of the objective (``Objective.auxiliary_embeddings``); ``learner_summary``
gives the mean and deviation over a head's individual learners; ``concat_pca`` builds the HORDE "†"
representation (thesis §5.4.1): the concatenation of the model's and the objective's embeddings reduced by a
PCA. Decisions the thesis leaves open: the l2-normalised per-order embeddings are concatenated; the PCA is
fitted on the **training** split (the test classes stay unseen), centred, not whitened; the result is
l2-normalised.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np
import torch

from ..data.table import RetrievalTable
from ..errors import DeepMetricError
from ..models.modes import eval_mode
from .evaluator import EmbedSettings, embed_outputs

if TYPE_CHECKING:
    from ..models.embedder import Embedder
    from ..models.heads import HeadOutput


@runtime_checkable
class _WithAuxiliaryEmbeddings(Protocol):
    """What evaluation reads of the training objective (``losses.Objective``, a layer it does not import)."""

    def auxiliary_embeddings(self, output: HeadOutput) -> dict[str, torch.Tensor]: ...


def embed_with_objective(model: Embedder, objective: torch.nn.Module, table: RetrievalTable,
                         settings: EmbedSettings, desc: str = "embedding") -> dict[str, np.ndarray]:
    """``{"embedding": model's, "<head>.<name>": ..., "<regulariser>.<name>": ...}`` for every row of ``table``."""
    if not isinstance(objective, _WithAuxiliaryEmbeddings):
        raise TypeError(f"objective: expected a module with auxiliary_embeddings(output) (losses.Objective), got "
                        f"{type(objective).__name__}")

    def select(output: HeadOutput) -> dict[str, torch.Tensor]:
        return {"embedding": output.embedding, **model.head.auxiliary_embeddings(output),
                **objective.auxiliary_embeddings(output)}

    with eval_mode(objective):
        return embed_outputs(model, table, settings, select, desc)


def learner_summary(rows: Mapping[str, Mapping[str, float | None]],
                    prefix: str | None) -> dict[str, dict[str, float | None]]:
    """Each metric's mean and standard deviation over the rows ``<prefix>1`` … ``<prefix>M`` (ABE Tables 1-2's
    "Ind" columns: mean ± std over the individual learners), as two rows; none for fewer than two learners.
    The paper does not say which deviation; this is the population one (numpy's default, ddof 0). A metric that is
    undefined (None: NMI of queries that are all of different classes) for a learner is undefined in both rows."""
    if not prefix:
        return {}
    members = {name: metrics for name, metrics in rows.items()
               if name.startswith(prefix) and name[len(prefix):].isdigit()}
    if len(members) < 2:
        return {}
    first = next(iter(members.values()))
    values = {key: [metrics[key] for metrics in members.values()] for key in first}
    defined = {key: np.array(v) for key, v in values.items() if None not in v}
    span = f"{prefix}1-{len(members)}"
    return {f"{span} mean": {key: float(defined[key].mean()) if key in defined else None for key in values},
            f"{span} std": {key: float(defined[key].std()) if key in defined else None for key in values}}


def concat_pca(fit: dict[str, np.ndarray], apply: dict[str, np.ndarray], dim: int = 512) -> np.ndarray:
    """Concatenate the embeddings (same keys in both), PCA to ``dim`` fitted on ``fit``, then l2."""
    from sklearn.decomposition import PCA

    if set(fit) != set(apply):
        raise DeepMetricError(f"concat_pca: the fit set has embeddings {sorted(fit)}, the other {sorted(apply)}")
    keys = sorted(fit)
    train = np.concatenate([fit[k] for k in keys], axis=1)
    if dim > min(train.shape):
        raise DeepMetricError(f"concat_pca: cannot keep {dim} components of {train.shape[0]} fit vectors of "
                              f"dimension {train.shape[1]}")
    pca = PCA(n_components=dim, svd_solver="full").fit(train)
    reduced = pca.transform(np.concatenate([apply[k] for k in keys], axis=1))
    return (reduced / np.linalg.norm(reduced, axis=1, keepdims=True).clip(1e-12)).astype(np.float32)
