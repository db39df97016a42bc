"""Building the objective from a run config's ``loss`` section: the metric loss (a built-in or
pytorch-metric-learning's) with its miner, tried on a trial batch before any image is read; the regularisers the
head asks for; a cross-batch memory; ``create_objective`` for a loop of one's own."""


from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError, DeepMetricError
from ..models.heads import Head
from .memory import CrossBatchMemory
from .objective import Objective
from .pml import PMLLoss, is_pml, memory_losses
from .registry import LOSSES, MINERS
from .regularizers import build_regularizer


def check_loss_options(name: str, options: dict[str, Any] | None = None, miner: str | None = None,
                       miner_options: dict[str, Any] | None = None) -> None:
    """Metric loss ``name`` and its miner exist and take the options given (config validation)."""
    LOSSES.check(name, options)
    if miner is None:
        if miner_options:
            raise ConfigError("loss.miner_options are set but loss.miner is not "
                              "(e.g. loss.miner=pml:MultiSimilarityMiner)")
        return
    if not is_pml(name):
        raise ConfigError(f"loss.miner={miner} needs a pytorch-metric-learning loss (loss.name=pml:<Class>); the "
                          f"built-in '{name}' weighs every pair of the batch itself")
    MINERS.check(miner, miner_options)


def check_memory_loss(name: str) -> None:
    """A cross-batch memory (``loss.memory.size > 0``) needs a metric loss of pairs or triplets: every built-in one;
    among pytorch-metric-learning's, those its own ``CrossBatchMemory`` supports (a proxy or classification loss
    compares embeddings with its proxies or weights, not with other embeddings: a memory has nothing to add)."""
    if is_pml(name):
        LOSSES.check(name)  # an unknown class is named first
        supported = memory_losses()
        if name.split(":", 1)[1] not in supported:
            raise ConfigError(f"loss.memory (a cross-batch memory) needs a loss on pairs or triplets of embeddings; "
                              f"'{name}' is not one (pytorch-metric-learning's CrossBatchMemory supports "
                              f"{', '.join(supported)}); set loss.memory.size=0 or choose another loss")


def build_loss(name: str, options: dict[str, Any] | None = None, num_classes: int | None = None,
               embedding_size: int | None = None, miner: str | None = None,
               miner_options: dict[str, Any] | None = None) -> nn.Module:
    """Build metric loss ``name`` (the table in the module docstring, with its equation).

    Args:
        name: a name of ``LOSSES``.
        options: the loss's keyword options (``LOSSES.options(name)``); unknown ones are refused by name.
        num_classes: the training classes, for losses with per-class parameters (margin's per-class beta, PML's
            proxies and class weights).
        embedding_size: the width of the embeddings the loss sees (PML's proxy and classification losses).
        miner: a ``MINERS`` name (PML losses only), with its ``miner_options``.

    Returns:
        The loss module: ``loss(embeddings (B, D) l2-normalised, labels (B,)) -> scalar``.
    """
    check_loss_options(name, options, miner, miner_options)
    with _as_config_error(name, options, miner, miner_options, "cannot be built"):
        loss = LOSSES.build(name, options, num_classes=num_classes, embedding_size=embedding_size,
                            descriptors_dim=embedding_size)
        if is_pml(name):
            loss = PMLLoss(loss, MINERS.build(miner, miner_options) if miner is not None else None)
    if embedding_size:
        try_loss(loss, embedding_size, num_classes, name, options, miner, miner_options)
    return loss


TRIAL_CLASSES, TRIAL_PER_CLASS = 4, 2
"""The trial batch every metric loss is run on once it is built: 4 classes x 2 random unit embeddings."""


def _describe(name: str, options: dict[str, Any] | None, miner: str | None,
              miner_options: dict[str, Any] | None) -> str:
    def listed(values: dict[str, Any] | None) -> str:
        return f" ({', '.join(f'{k}={v!r}' for k, v in values.items())})" if values else ""

    text = f"loss '{name}'{listed(options)}"
    return text + (f" with miner '{miner}'{listed(miner_options)}" if miner is not None else "")


class _as_config_error:
    """Turn any exception but a ``DeepMetricError`` into one ``ConfigError`` naming the loss, the miner and their
    options, with the original message (PML's and our losses check their options at build or at the first call)."""

    def __init__(self, name: str, options: dict[str, Any] | None, miner: str | None,
                 miner_options: dict[str, Any] | None, what: str):
        self.described, self.what = _describe(name, options, miner, miner_options), what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> Literal[False]:
        if error is None or isinstance(error, DeepMetricError) or not isinstance(error, Exception):
            return False
        message = " ".join(str(error).split()) or type(error).__name__
        raise ConfigError(f"{self.described} {self.what}: {type(error).__name__}: {message[:500]}") from None


def try_loss(loss: nn.Module, embedding_size: int, num_classes: int | None, name: str,
             options: dict[str, Any] | None = None, miner: str | None = None,
             miner_options: dict[str, Any] | None = None, reference: bool = False) -> None:
    """Run ``loss`` once on a trial batch (``TRIAL_CLASSES`` x ``TRIAL_PER_CLASS`` random unit embeddings of width
    ``embedding_size``, on the CPU, its backward too), so that options PML or our losses accept at build but fail on
    (a wrong type, a bad choice, a loss with another call) are refused before any image is read or file written.
    With ``reference`` (a cross-batch memory) the loss is run with a second trial batch as its reference set instead.
    The global RNG, the loss's state and its gradients are left as they were; a failure or a non-scalar result is one
    ``ConfigError`` naming the loss, its miner and their options."""
    classes = max(1, min(TRIAL_CLASSES, num_classes or TRIAL_CLASSES))
    state = {k: v.detach().clone() for k, v in loss.state_dict().items()}
    grads = {n: p.grad for n, p in loss.named_parameters()}
    try:
        with torch.random.fork_rng(devices=[]), _as_config_error(name, options, miner, miner_options,
                                                                 "fails on a trial batch"):
            generator = torch.Generator().manual_seed(0)
            embeddings = F.normalize(torch.randn(classes * TRIAL_PER_CLASS, embedding_size, generator=generator),
                                     dim=1).requires_grad_(True)
            labels = torch.arange(classes).repeat_interleave(TRIAL_PER_CLASS)
            calls: list[tuple[torch.Tensor, ...]] = [()]
            if reference:  # (the call without one ran when the loss was built)
                calls = [(F.normalize(torch.randn(len(labels), embedding_size, generator=generator), dim=1),
                          labels.flip(0))]
            for extra in calls:
                value = loss(embeddings, labels, *extra)
                if not isinstance(value, torch.Tensor) or value.numel() != 1:
                    raise ValueError(f"it returned {type(value).__name__} "
                                     f"{tuple(value.shape) if isinstance(value, torch.Tensor) else ''}, not a scalar"
                                     f"{' with a reference set' if extra else ''}")
                if value.requires_grad:
                    value.backward()
    finally:
        loss.load_state_dict(state)
        for n, p in loss.named_parameters():
            p.grad = grads[n]


def build_objective(config: Any, head: Head, num_classes: int | None = None) -> Objective:
    """The objective of a run: ``config`` is the ``loss`` section; unset choices take the head's defaults
    (``Head.metric_on``, ``Head.parts_reduction``, ``Head.default_regularizers``)."""
    on = config.on or head.metric_on
    reduction = config.parts_reduction or head.parts_reduction
    specs = config.regularizers if config.regularizers is not None else head.default_regularizers

    copies = head.num_parts if on == "parts" else 1
    width = head.embedding_dim // copies

    def metric_loss() -> nn.Module:
        return build_loss(config.name, config.options, num_classes, embedding_size=width,
                          miner=config.miner, miner_options=config.miner_options)

    losses = [metric_loss() for _ in range(copies)]
    regularizers = {name: build_regularizer(name, options, head, num_classes, metric_loss)
                    for name, options in specs.items()}
    memory = build_memory(getattr(config, "memory", None))
    if memory is not None:
        check_memory_loss(config.name)
        for loss in losses:  # each takes a reference set (a loss of one's own registered without one is refused)
            try_loss(loss, width, num_classes, config.name, config.options, config.miner, config.miner_options,
                     reference=True)
    return Objective(losses, on=on, parts_reduction=reduction, regularizers=regularizers, num_classes=num_classes,
                     memory=memory)


def build_memory(config: Any) -> CrossBatchMemory | None:
    """The cross-batch memory of a ``loss.memory`` section (``size``, ``warmup_steps``, ``weight``; a mapping of them
    too), or None when its size is 0 (off) or it is absent."""
    if config is None:
        return None
    values = dict(config) if isinstance(config, dict) else {k: getattr(config, k) for k in ("size", "warmup_steps",
                                                                                             "weight")}
    unknown = sorted(set(values) - {"size", "warmup_steps", "weight"})
    if unknown:
        raise ConfigError(f"loss.memory: unknown option(s) {unknown}; expected size, warmup_steps, weight")
    if not values.get("size"):
        return None
    return CrossBatchMemory(**values)


def create_objective(head: Head, loss: str = "binomial", options: dict[str, Any] | None = None, *,
                     num_classes: int | None = None, regularizers: dict[str, dict[str, Any]] | None = None,
                     on: str | None = None, parts_reduction: str | None = None, miner: str | None = None,
                     miner_options: dict[str, Any] | None = None, memory: dict[str, Any] | None = None) -> Objective:
    """The objective by name, for a training loop of your own: ``create_objective(model.head, "binomial",
    num_classes=C)`` is what ``deepmetric train`` builds from ``loss.name=binomial`` (``build_objective`` of the run
    config's ``loss`` section; each argument is that section's key of the same name, None taking the head's default).

    Args:
        head: the model's head (``Embedder.head``): it gives the defaults and the width of each metric loss.
        loss: a name of ``LOSSES`` (``contrastive``, ``triplet``, ``binomial``, ``multi-similarity``, ``margin``,
            ``pml:<Class>``), with its keyword ``options``.
        num_classes: the number of training classes, for losses with per-class parameters (margin's beta, proxies);
            the labels passed to the objective are then class indices in ``range(num_classes)``.
        regularizers: ``{name: {"weight": w, option: value}}``; None: the head's defaults (ABE's divergence ...),
            ``{}``: none.
        on: ``embedding`` or ``parts`` (one metric loss per learner); None: the head's choice.
        parts_reduction: ``mean`` or ``sum`` of the per-part losses; None: the head's choice.
        miner: a pytorch-metric-learning miner (``pml:<Class>``, with a ``pml:`` loss only) and its ``miner_options``.
        memory: a cross-batch memory, ``{"size": M, "warmup_steps": W, "weight": w}`` (``deepmetric.losses.memory``;
            warm-up 1,000 steps and weight 1 unless given); None or size 0: none. Call ``objective.set_step(step)``
            before each step, as the trainer does, for the warm-up to end.

    Returns:
        The ``Objective``: ``loss, terms = objective(model(images), labels)``, the total and its unweighted terms;
        an ``nn.Module`` whose parameters (if any) the optimiser must train too.
    """
    section = SimpleNamespace(name=loss, options=dict(options or {}), on=on, parts_reduction=parts_reduction,
                              regularizers=regularizers, miner=miner, miner_options=dict(miner_options or {}),
                              memory=dict(memory or {}))
    return build_objective(section, head, num_classes)


def check_objective(config: Any, head: Head) -> None:
    """Build the objective of loss section ``config`` for ``head`` with ``TRIAL_CLASSES`` classes, each metric loss
    run on its trial batch (``try_loss``), before the data are read: a loss or miner that fails on its options is
    one ``ConfigError`` before any image is read or file written. The global RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        build_objective(config, head, num_classes=TRIAL_CLASSES)
