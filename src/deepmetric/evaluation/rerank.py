"""Re-ranking after the exact kNN: the methods, their settings and their bound (no torch here, so that the command
line can name and check them before it imports torch; the algorithms are in ``kreciprocal.py`` and
``expansion.py``).

- ``k-reciprocal``: k-reciprocal encoding (Zhong et al., CVPR 2017, "Re-ranking Person Re-identification with
  k-reciprocal Encoding"): ``d* = (1 - λ) d_J + λ d`` (Eq. 12), d_J the Jaccard distance of the items' expanded
  k-reciprocal neighbourhoods (Eqs. 3-11). Settings ``KReciprocal(k1=20, k2=6, lambda_value=0.3)``, the paper's.
- ``qe``, ``dba``, ``dba+qe``: α-weighted query expansion and database-side augmentation (Radenović, Tolias and
  Chum, TPAMI 2018, "Fine-tuning CNN Image Retrieval with No Human Annotation"): a query becomes
  ``normalise(q + Σ_{i<=n} max(s_i, 0)^α x_i)`` over its n nearest gallery items, a gallery item the same over its
  n nearest other gallery items. Settings ``QueryExpansion(qe_n=10, dba_n=0, alpha=3.0)``.

A re-ranking changes rankings only: NMI (a k-means of the embeddings) is the same with or without one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from ..errors import DeepMetricError

RERANK_METHODS = ("k-reciprocal", "qe", "dba", "dba+qe")
"""The re-rankings ``--rerank`` names: k-reciprocal encoding, αQE, DBA, DBA then αQE."""

MAX_ITEMS = 70_000
"""The most items an evaluation re-ranks by k-reciprocal encoding (the queries and the gallery together) or augments
by DBA (the gallery) unless told otherwise (``max_items``; the command line's ``--rerank-max-items``). Their time
grows as the square of the items, at 4 to 8 times the plain evaluation's (``benchmarks/rerank_cost.py``,
docs/benchmarks/reranking.md): every benchmark of the field fits (SOP's 60,502 the largest)."""

MAX_SEARCH_ITEMS = 20_000
"""The same bound for a search (``deepmetric search``, ``Index.search``), which relates the whole gallery again at
every call before it re-ranks each query alone (docs/benchmarks/reranking.md)."""

QE_N = 10
"""Default neighbours of αQE and DBA: fast-reid's ``aqe`` default (``qe_k=10``), not taken from the paper, whose
landmark queries have tens of relevant images (ours have a handful). α's default, 3, is the paper's."""


def _whole(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise DeepMetricError(f"re-ranking: {name} must be a whole number >= {low}, got {value!r}")
    return value


def _number(name: str, value: Any, low: float, high: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or value < low \
            or (high is not None and value > high) or value == float("inf"):
        bound = f"from {low:g} to {high:g}" if high is not None else f">= {low:g}"
        raise DeepMetricError(f"re-ranking: {name} must be a number {bound}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class KReciprocal:
    """k-reciprocal re-ranking (Zhong et al. 2017): ``k1`` neighbours of the k-reciprocal sets (Eq. 4; ``k1/2``
    for the expansion of Eq. 6), ``k2`` of the local query expansion (Eq. 10), ``lambda_value`` the weight of the
    original distance (Eq. 12); ``max_items`` the bound on the items it relates (None: ``MAX_ITEMS`` in an
    evaluation, ``MAX_SEARCH_ITEMS`` in a search)."""

    k1: int = 20
    k2: int = 6
    lambda_value: float = 0.3
    max_items: int | None = None
    method: ClassVar[str] = "k-reciprocal"

    def __post_init__(self) -> None:
        _whole("k1", self.k1, 1)
        _whole("k2", self.k2, 1)
        _number("lambda", self.lambda_value, 0.0, 1.0)
        if self.max_items is not None:
            _whole("max_items", self.max_items, 2)

    def to_dict(self) -> dict[str, Any]:
        """The settings as a record writes them (``max_items`` left out: it changes no figure)."""
        return {"method": self.method, **{k: v for k, v in asdict(self).items() if k != "max_items"}}


@dataclass(frozen=True)
class QueryExpansion:
    """α-weighted query expansion over ``qe_n`` neighbours (0: none) after database-side augmentation over
    ``dba_n`` (0: none), weights ``max(s, 0)^alpha`` (Radenović et al. 2018; ``alpha=0`` is average query
    expansion); ``max_items`` bounds DBA's gallery (None: ``MAX_ITEMS`` in an evaluation, ``MAX_SEARCH_ITEMS`` in a
    search)."""

    qe_n: int = QE_N
    dba_n: int = 0
    alpha: float = 3.0
    max_items: int | None = None

    def __post_init__(self) -> None:
        _whole("qe_n", self.qe_n, 0)
        _whole("dba_n", self.dba_n, 0)
        _number("alpha", self.alpha, 0.0)
        if self.max_items is not None:
            _whole("max_items", self.max_items, 2)
        if not self.qe_n and not self.dba_n:
            raise DeepMetricError("re-ranking: qe_n and dba_n are both 0, which re-ranks nothing")

    @property
    def method(self) -> str:
        return "+".join(name for name, n in (("dba", self.dba_n), ("qe", self.qe_n)) if n)

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, **{k: v for k, v in asdict(self).items() if k != "max_items"}}


Rerank = KReciprocal | QueryExpansion

OPTIONS = {"k-reciprocal": ("k1", "k2", "lambda_value"), "qe": ("qe_n", "alpha"), "dba": ("dba_n", "alpha"),
           "dba+qe": ("qe_n", "dba_n", "alpha")}
"""The options each method takes (``max_items`` goes with every method)."""


def rerank_settings(method: str, max_items: int | None = None, **options: Any) -> Rerank:
    """The settings of ``method`` (one of ``RERANK_METHODS``) with ``options`` (None: the default), refusing an option
    the method does not take: ``rerank_settings("k-reciprocal", k1=30)``, ``rerank_settings("dba+qe", qe_n=5)``."""
    if method not in OPTIONS:
        raise DeepMetricError(f"re-ranking must be one of {', '.join(RERANK_METHODS)}, got {method!r}")
    given = {name: value for name, value in options.items() if value is not None}
    foreign = [name for name in given if name not in OPTIONS[method]]
    if foreign:
        owner = next((m for m, names in OPTIONS.items() if foreign[0] in names), None)
        goes = f" (it goes with {owner})" if owner else ""
        raise DeepMetricError(f"re-ranking {method} takes no {foreign[0]}{goes}")
    if max_items is not None:
        given["max_items"] = max_items
    if method == "k-reciprocal":
        return KReciprocal(**given)
    if method == "qe":
        return QueryExpansion(**{"dba_n": 0, **given})
    if method == "dba":
        return QueryExpansion(**{"qe_n": 0, "dba_n": QE_N, **given})
    return QueryExpansion(**{"dba_n": QE_N, **given})


def as_rerank(value: Rerank | str | None) -> Rerank | None:
    """A re-ranking given to the Python functions: settings, a method's name (its defaults) or None (none)."""
    if value is None or isinstance(value, KReciprocal | QueryExpansion):
        return value
    if isinstance(value, str):
        return rerank_settings(value)
    raise DeepMetricError(f"rerank must be None, one of {', '.join(RERANK_METHODS)} or settings "
                          f"(KReciprocal, QueryExpansion), got {type(value).__name__}")


def check_items(settings: Rerank, items: int, what: str, search: bool = False) -> None:
    """Refuse relating more than ``settings.max_items`` items pairwise (by default ``MAX_ITEMS``, or
    ``MAX_SEARCH_ITEMS`` in a ``search``), in one message naming the way to raise the bound."""
    bound = settings.max_items if settings.max_items is not None else MAX_SEARCH_ITEMS if search else MAX_ITEMS
    if items > bound:
        raise DeepMetricError(
            f"{settings.method} re-ranking relates every pair of the {items:,} {what}, more than its bound of "
            f"{bound:,}{' for a search' if search else ''}: its time grows as the square of the items "
            "(docs/benchmarks/reranking.md); raise the bound with --rerank-max-items (max_items= in Python) if "
            "you can wait")


def reranked_knn(query: Any, gallery: Any, k: int, self_index: Any, settings: Rerank, memory_mb: float = 256.0,
                 engine: str = "auto", progress: bool = False) -> Any:
    """``knn.iter_knn``'s blocks ``(first query, values (b, k), gallery indices (b, k))`` after re-ranking: by ``d*``
    for k-reciprocal (values ``-d*``), by similarity of the expanded vectors for αQE/DBA; same arguments."""
    if isinstance(settings, KReciprocal):
        from .kreciprocal import k_reciprocal_knn

        return k_reciprocal_knn(query, gallery, k, self_index, settings, memory_mb, engine, progress)
    from .expansion import expanded_embeddings
    from .knn import iter_knn

    query, gallery = expanded_embeddings(query, gallery, self_index, settings, memory_mb, engine)
    return iter_knn(query, gallery, k, self_index, memory_mb, engine)


def reranked_search(queries: Any, gallery: Any, k: int, settings: Rerank, engine: str = "auto",
                    progress: bool = False) -> tuple[Any, Any]:
    """Each query's ``k`` best gallery items after re-ranking, each query alone against the gallery: ``(scores,
    ids)``, numpy (Q, min(k, G)), best first, ties by id. Scores: ``1 - d*`` for k-reciprocal, the cosine similarity
    of the expanded query to the (augmented) item for αQE/DBA. ``queries`` (Q, D) and ``gallery`` (G, D) are
    l2-normalised float32 tensors."""
    if isinstance(settings, KReciprocal):
        from .kreciprocal import k_reciprocal_search

        return k_reciprocal_search(queries, gallery, k, settings, engine, progress)
    from .expansion import expanded_embeddings
    from .knn import knn

    queries, gallery = expanded_embeddings(queries, gallery, None, settings, engine=engine, search=True)
    scores, ids = knn(queries, gallery, min(k, gallery.shape[0]), engine=engine)
    return scores.double().numpy(), ids.numpy()
