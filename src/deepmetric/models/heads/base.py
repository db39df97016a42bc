"""The head contract: ``Head.forward(F) -> HeadOutput``; the trainer never asks which head it has."""

from __future__ import annotations

import inspect
import logging
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ...errors import ConfigError

if TYPE_CHECKING:
    from ..backbones import Backbone

log = logging.getLogger("deepmetric")

# Constructor arguments a head gets from the backbone and the model config rather than from options.
PROVIDED_ARGUMENTS = ("self", "cls", "backbone", "tail", "in_channels", "embedding_dim", "options")


@dataclass
class HeadOutput:
    """What every head returns.

    ``embedding`` (B, D): the l2-normalised vector used for retrieval. ``parts``: per-learner
    l2-normalised embeddings (a one-element list for single-learner heads), for per-learner losses.
    ``attention`` (B, N, h, w) or None: maps for visualisation. ``extras``: tensors a regulariser
    needs, e.g. ``feature_map`` (the local features the head pooled).
    """

    embedding: torch.Tensor
    parts: list[torch.Tensor]
    attention: torch.Tensor | None = None
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

    def map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> HeadOutput:
        """A new output with ``fn`` applied to every tensor, those in ``parts`` and ``extras`` included."""

        def apply(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                return fn(value)
            if isinstance(value, list):
                return [apply(v) for v in value]
            if isinstance(value, dict):
                return {k: apply(v) for k, v in value.items()}
            return value

        return HeadOutput(**{f.name: apply(getattr(self, f.name)) for f in fields(self)})

    def float(self) -> HeadOutput:
        """Every floating tensor in float32 (differentiably). After a forward pass under bfloat16 or float16 autocast
        (``train.amp``) the objective gets these, so losses and regularisers are computed in float32."""
        return self.map_tensors(lambda t: t.float() if t.is_floating_point() else t)


class Head(nn.Module):
    """Base class of every head. ``tests/test_head_contract.py`` checks every registered head against this contract.

    Every head sets ``embedding_dim`` (D of its embedding) and returns a ``HeadOutput`` whose ``parts`` hold
    ``num_parts`` learners. It declares, as class attributes, what the objective should do with its output unless
    the config says otherwise, so that ``--head NAME`` alone trains the method as its paper does:

    - ``pretrained_modules``: names of sub-modules holding pretrained weights (a backbone tail or a copy),
      trained at the backbone's learning rate (parameter group ``pretrained``);
    - ``metric_on``: ``embedding`` (one metric loss on the concatenation) or ``parts`` (one per learner);
    - ``parts_reduction``: ``mean`` or ``sum`` of the per-part losses;
    - ``default_regularizers``: ``{name: {"weight": w, **options}}`` added to the objective;
    - ``default_groups``: ``{group: {"lr_scale": s, ...}}`` for the optimiser's named groups (its own and the
      objective's ``loss``), under ``train.groups`` (the config wins, key by key; absent groups are ignored).

    ``parameter_groups`` names groups of parameters that can get their own learning-rate scale and
    weight decay (``train.groups``); every parameter belongs to exactly one group.

    Optional hooks, each with a default here that means "this head does not do it" (the callers never ask
    ``getattr``; they read the attribute or call the method):

    - local features: a head that puts them in ``extras["feature_map"]`` sets ``feature_channels`` (their
      channels), so that regularisers on local features (HORDE) can size themselves;
    - a pooled-vector encoder: a head whose embedding is a function of one pooled vector (GAP -> linear -> l2)
      sets ``pooled_dim``, puts that vector in ``extras["pooled"]`` and implements ``encode(pooled) ->
      embedding``: example generators (MIRAGE) decode embeddings back to that space and re-embed what they
      generate. ``normalized`` says whether the embedding is l2-normalised;
    - attention maps: a head that returns them (B, ``num_maps``, h, w) says so in ``has_attention_maps`` (read
      from a run's saved spec without building its model: ``deepmetric explain`` refuses a head without maps at
      once) and names one map ``part_name`` (DIABLO's dictionary "entry", ABE's "learner", DGML's "group",
      DeML's "scale"), which the report and ``deepmetric explain`` use as labels; ``num_maps`` is ``num_parts``
      unless the maps are not the learners (DeML);
    - sub-embeddings: a head whose paper scores sub-embeddings on their own (DeML's root-learners, Table 2's O
      columns; ABE's individual learners, Tables 1-2) returns them from ``auxiliary_embeddings(output)``;
      ``deepmetric evaluate --all-embeddings`` scores each. A head whose paper reports its learners one by one
      and then their mean ± std (ABE's "Ind" columns) sets ``individual_learners`` to the prefix of those rows
      (``each_part`` names them ``<prefix>1`` … ``<prefix>M``), and ``--all-embeddings`` adds the two summary
      rows;
    - data-dependent initialisation (e.g. a k-means dictionary): the head sets ``init_images`` > 0 and
      implements ``initialize(feature_batches)``: before training (not when resuming) the trainer passes the
      trunk features F of that many training images, without augmentation, batch by batch;
    - export (``deepmetric export``): a head whose forward pass computes something outside torch that the
      embedding depends on (a NumPy/SciPy step a trace would freeze into a constant) returns the reason from
      ``export_blocker()``; the exporter refuses it with that reason (and checks every other head's exported
      file against PyTorch anyway).
    """

    embedding_dim: int
    pretrained_modules: tuple[str, ...] = ()
    metric_on: str = "embedding"
    parts_reduction: str = "mean"
    default_regularizers: dict[str, dict[str, Any]] = {}
    default_groups: dict[str, dict[str, Any]] = {}
    feature_channels: int | None = None
    pooled_dim: int | None = None
    normalized: bool = True
    init_images: int = 0
    has_attention_maps: bool = False
    part_name: str = "map"
    individual_learners: str | None = None

    @classmethod
    def from_backbone(cls, backbone: Backbone, embedding_dim: int, *args: Any, **options: Any) -> Head:
        """Build the head on top of ``backbone`` (the default passes its tail and the tail's channels). A head that
        overrides it declares its own options (``*args, **options`` here lets the type checker accept that)."""
        return cls(*args, tail=backbone.tail, in_channels=backbone.tail_channels, embedding_dim=embedding_dim,
                   **options)

    @classmethod
    def default_split(cls, backbone_name: str, **options: Any) -> str | None:
        """Where this head (with these options) wants the backbone cut when the config does not say
        (None: after the last stage)."""
        return None

    @classmethod
    def option_names(cls) -> list[str]:
        """The head's options: the keywords of its own ``from_backbone`` if it has one, and those of
        ``__init__`` when there is none or it forwards ``**options``."""
        own_builder = inspect.getattr_static(cls, "from_backbone") is not inspect.getattr_static(Head, "from_backbone")
        builders: list[Callable[..., Any]] = [cls.from_backbone, cls.__init__] if own_builder else [cls.__init__]
        names: list[str] = []
        for builder in builders:
            parameters = inspect.signature(builder).parameters.values()
            names += [p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                      and p.name not in PROVIDED_ARGUMENTS and p.name not in names]
            if not any(p.kind == p.VAR_KEYWORD for p in parameters):
                break
        return names

    @classmethod
    def option_types(cls) -> dict[str, Any]:
        """Each option's declared type (its annotation in ``from_backbone`` or ``__init__``, as ``option_names`` finds
        it), for the config to check a value before the head is built; an option without one is ``Any``."""
        from ..backbones import Backbone  # named in from_backbone's annotations, imported only for type checks

        hints: dict[str, Any] = {}
        for builder in (cls.from_backbone, cls.__init__):
            for name, hint in typing.get_type_hints(builder, localns={"Backbone": Backbone}).items():
                hints.setdefault(name, hint)
        return {name: hints.get(name, Any) for name in cls.option_names()}

    def pretrained_parameters(self) -> list[nn.Parameter]:
        return [p for name in self.pretrained_modules for p in getattr(self, name).parameters()]

    def new_parameters(self) -> list[nn.Parameter]:
        pretrained = {id(p) for p in self.pretrained_parameters()}
        return [p for p in self.parameters() if id(p) not in pretrained]

    def parameter_groups(self) -> dict[str, list[nn.Parameter]]:
        """Named groups covering every parameter once; the default is ``pretrained`` and ``new``."""
        return {"pretrained": self.pretrained_parameters(), "new": self.new_parameters()}

    def auxiliary_embeddings(self, output: HeadOutput) -> dict[str, torch.Tensor]:
        """``{"<head>.<name>": (B, D) l2-normalised}``: sub-embeddings scored on their own (default: none)."""
        return {}

    def initialize(self, feature_batches: Iterable[torch.Tensor]) -> None:
        """Data-dependent initialisation from trunk features (B, C, h, w) of training images (default: none)."""

    @property
    def num_parts(self) -> int:
        """How many per-learner embeddings ``HeadOutput.parts`` holds."""
        return 1

    @property
    def num_maps(self) -> int:
        """How many attention maps ``HeadOutput.attention`` holds (when it holds any): one per learner by default."""
        return self.num_parts

    def export_blocker(self) -> str | None:
        """Why this head (with its options) cannot be exported to ONNX or TorchScript; None: it can be tried."""
        return None

    def encode(self, pooled: torch.Tensor) -> torch.Tensor:
        """Embed (B, pooled_dim) pooled feature vectors; only heads that set ``pooled_dim`` implement it."""
        raise NotImplementedError(f"{type(self).__name__} has no pooled-vector encoder")

    def forward(self, features: torch.Tensor) -> HeadOutput:  # pragma: no cover - abstract
        raise NotImplementedError


def check_embedding_dim(head: str, embedding_dim: int) -> int:
    """``model.embedding_dim`` for a head that always projects: at least 1 (0 means "no projection, the pooled
    features" only to ``gap``; elsewhere it made a 0-d embedding that trained on nothing)."""
    if embedding_dim < 1:
        raise ConfigError(f"head '{head}': model.embedding_dim must be at least 1, got {embedding_dim} (0, the "
                          "pooled features without a projection, is the gap head's)")
    return embedding_dim


def learner_dim(head: str, embedding_dim: int, learners: int) -> int:
    """Dimensions of each of ``learners`` equal learners sharing ``model.embedding_dim`` D: floor(D / M), DeML's
    rule (§3.1: CA_(i,j) in R^{d/(IJ)}, floored). When M does not divide D the embedding has M floor(D / M)
    dimensions (DeML(3,3): 9 x 56 = 504 of 512), which a warning says once, as the head is built."""
    if learners < 1:
        raise ConfigError(f"{head}: needs at least one learner, got {learners}")
    if embedding_dim < learners:
        raise ConfigError(f"{head}: model.embedding_dim={embedding_dim} is too small for {learners} learners (each "
                          "needs at least one dimension)")
    per_learner = embedding_dim // learners
    if per_learner * learners != embedding_dim:
        log.warning("%s: model.embedding_dim=%d does not split evenly over %d learners; the embedding has %d "
                    "dimensions (%d each)", head, embedding_dim, learners, per_learner * learners, per_learner)
    return per_learner


def each_part(output: HeadOutput, prefix: str) -> dict[str, torch.Tensor]:
    """``{"<prefix>1": part 1, ...}``: every learner's own (l2-normalised) embedding, when there are several."""
    return {f"{prefix}{m + 1}": part for m, part in enumerate(output.parts)} if len(output.parts) > 1 else {}
