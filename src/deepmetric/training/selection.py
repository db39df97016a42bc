"""Which checkpoint a run keeps and when it stops: validation figures ranked by ``train.select_by``
(``selection_key``), early stopping (``train.patience``), and whether the kept checkpoint beats the untrained
backbone."""

from __future__ import annotations

from typing import Any


def selection_key(metrics: dict[str, float], by: str = "recall@1") -> list[float]:
    """How validation ranks checkpoints (``train.select_by``): Recall@1, ties (it saturates on small validation
    sets) broken by MAP@R, then R-precision; or MAP@R first, then Recall@1 and R-precision."""
    first, second = ("map@r", "recall@1") if by == "map@r" else ("recall@1", "map@r")
    return [metrics[first], metrics[second], metrics["r_precision"]]


def improves(key: list[float], best: dict[str, Any]) -> bool:
    if best.get("score") is None:
        return True
    held = best.get("key") or [best["score"], float("-inf"), float("-inf")]  # a checkpoint from before the tie rule
    return key > held


def beats_backbone(best: dict[str, Any], backbone: dict[str, float] | None, by: str = "recall@1") -> bool | None:
    """Whether the selected checkpoint's validation figures rank above the untrained backbone's by
    ``selection_key``; None when either is unknown."""
    if backbone is None or best.get("key") is None:
        return None
    return list(best["key"]) > selection_key(backbone, by)


def out_of_patience(patience: int, eval_every: int, best_step: int | None, step: int) -> bool:
    """Whether ``train.patience`` validations in a row have passed since the best one (at ``best_step``)."""
    return bool(patience) and best_step is not None and step - best_step >= patience * eval_every
