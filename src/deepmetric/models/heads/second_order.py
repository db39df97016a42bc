"""Second-order pooling heads (``--head bilinear``, thesis ch. 3): pool the outer products of the local
features, normalise, embed, l2.

Local features ``x`` are the trunk's output F (the head runs no tail; ``model.split`` chooses the layer),
optionally reduced by a 1x1 convolution without bias (``reduce_dim``; 256 for the thesis' BP baseline, inferred
from Table 4.2's parameter counts: the thesis does not state it).

``pooling``: ``second_order`` (eq. 3.1), ``covariance`` (eq. 3.2) or ``bilinear`` (eq. 3.3: two streams,
here two 1x1 reductions of the same features, as one trunk has one feature map).

``factorization``:

| name | representation | embedding to D |
|---|---|---|
| ``none`` | ``vec(Σ)`` (c² values), after ``matrix_norm`` | linear c² -> D |
| ``random_maclaurin`` | ``mean_x (W_1^T x) ⊙ (W_2^T x) / sqrt(d)``, ±1 fixed (eq. 3.44-3.45) | linear d -> D |
| ``tensor_sketch`` | ``mean_x TS(x)`` (eq. 3.46-3.48) | linear d -> D |
| ``rank_one`` | ``mean_x (U^T x) ⊙ (V^T x)``, learned U, V (eq. 3.53) | is the embedding (d = D) |
| ``hpbp`` | ``P^T mean_x (U^T x) ⊙ (V^T x)``, U, V: c x R (eq. 3.55-3.56) | P: R -> D |

The factorised forms approximate second-order pooling (``covariance`` centres the features of each image
first: the second-order moment of centred features is the covariance). ``matrix_norm`` (``none``,
``power`` = eigendecomposition ``Σ^α``, ``newton_schulz`` = iSQRT-COV square root) needs the c x c
matrix, so only ``factorization=none`` with symmetric pooling takes it. ``signed_sqrt`` applies
``sign(v) sqrt(|v|)`` to the representation (before ``P`` for ``hpbp``); an l2 normalisation follows
before the embedding, and the embedding is l2-normalised.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import ConfigError
from ..backbones import Backbone
from ..high_order import HighOrderMoments
from ..high_order.matrix import covariance, cross, matrix_power, newton_schulz_sqrt, second_order, signed_sqrt
from ..high_order.sketch import TensorSketch
from .base import Head, HeadOutput, check_embedding_dim
from .registry import HEADS

POOLINGS = ("second_order", "covariance", "bilinear")
FACTORIZATIONS = ("none", "random_maclaurin", "tensor_sketch", "rank_one", "hpbp")
MATRIX_NORMS = ("none", "power", "newton_schulz")


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"head 'bilinear': {name} must be one of {', '.join(choices)}, got '{value}'")


def reduction(in_channels: int, reduce_dim: int | None) -> tuple[nn.Module, int]:
    """A 1x1 convolution without bias to ``reduce_dim`` channels (identity when None or 0)."""
    if not reduce_dim:
        return nn.Identity(), in_channels
    return nn.Conv2d(in_channels, reduce_dim, 1, bias=False), reduce_dim


@HEADS.register("bilinear")
class SecondOrderHead(Head):
    def __init__(self, in_channels: int, embedding_dim: int = 512, pooling: str = "second_order",
                 factorization: str = "none", matrix_norm: str = "none", signed_sqrt: bool = True,
                 reduce_dim: int | None = 256, sketch_dim: int = 8192, rank: int = 2048, power: float = 0.5,
                 iterations: int = 5, seed: int = 0):
        super().__init__()
        _choice("pooling", pooling, POOLINGS)
        _choice("factorization", factorization, FACTORIZATIONS)
        _choice("matrix_norm", matrix_norm, MATRIX_NORMS)
        if matrix_norm != "none" and (factorization != "none" or pooling == "bilinear"):
            raise ConfigError(f"head 'bilinear': matrix_norm '{matrix_norm}' needs the symmetric c x c matrix; "
                              f"use factorization=none with pooling second_order or covariance")
        if pooling == "bilinear" and factorization != "none":
            raise ConfigError("head 'bilinear': two-stream pooling is implemented with factorization=none only")
        self.pooling, self.factorization, self.matrix_norm = pooling, factorization, matrix_norm
        self.use_signed_sqrt, self.power, self.iterations = signed_sqrt, power, iterations
        self.embedding_dim = check_embedding_dim("bilinear", embedding_dim)
        self.feature_channels = in_channels  # extras["feature_map"] is the trunk's output F
        self.reduce, c = reduction(in_channels, reduce_dim)
        if pooling == "bilinear":
            self.reduce2, _ = reduction(in_channels, reduce_dim)
        self.factor: HighOrderMoments | TensorSketch | None = None
        if factorization == "none":
            size = c * c
        elif factorization == "random_maclaurin":
            self.factor, size = HighOrderMoments(c, 2, sketch_dim, "rm_fixed", scale=True, seed=seed), sketch_dim
        elif factorization == "tensor_sketch":
            self.factor, size = TensorSketch(c, sketch_dim, seed), sketch_dim
        else:
            size = embedding_dim if factorization == "rank_one" else rank
            self.factor = HighOrderMoments(c, 2, size, "learned")
        self.representation_dim = size
        self.embed = nn.Identity() if factorization == "rank_one" else nn.Linear(size, embedding_dim, bias=False)

    @classmethod
    def from_backbone(cls, backbone: Backbone, embedding_dim: int, **options: Any) -> SecondOrderHead:
        return cls(in_channels=backbone.channels, embedding_dim=embedding_dim, **options)

    def _matrix(self, features: torch.Tensor) -> torch.Tensor:
        x = self.reduce(features).flatten(2)  # (B, c, N)
        if self.pooling == "bilinear":
            return cross(x, self.reduce2(features).flatten(2))
        sigma = covariance(x) if self.pooling == "covariance" else second_order(x)
        if self.matrix_norm == "power":
            return matrix_power(sigma, self.power)
        if self.matrix_norm == "newton_schulz":  # a tiny ridge keeps rank-deficient Σ (N < c) definite
            ridge = 1e-6 * sigma.diagonal(dim1=1, dim2=2).mean(dim=1)[:, None, None]
            eye = torch.eye(sigma.shape[-1], dtype=sigma.dtype, device=sigma.device)
            return newton_schulz_sqrt(sigma + ridge * eye, self.iterations)
        return sigma

    def _factorized(self, features: torch.Tensor) -> torch.Tensor:
        x = self.reduce(features)
        b, c, h, w = x.shape
        x = x.permute(0, 2, 3, 1).reshape(b, h * w, c)
        if self.pooling == "covariance":
            x = x - x.mean(dim=1, keepdim=True)
        if isinstance(self.factor, TensorSketch):
            return self.factor(x.reshape(b * h * w, c)).view(b, h * w, -1).mean(dim=1)
        assert self.factor is not None  # representation() comes here only with a factor
        return self.factor.locations(x.reshape(b * h * w, c))[0].view(b, h * w, -1).mean(dim=1)

    def representation(self, features: torch.Tensor) -> torch.Tensor:
        """(B, C, h, w) -> (B, representation_dim): the pooled (and normalised) statistics before the embedding."""
        z = self._matrix(features).flatten(1) if self.factor is None else self._factorized(features)
        if self.use_signed_sqrt:
            z = signed_sqrt(z)
        return F.normalize(z, dim=1)

    def forward(self, features: torch.Tensor) -> HeadOutput:
        embedding = F.normalize(self.embed(self.representation(features)), dim=1)
        return HeadOutput(embedding=embedding, parts=[embedding], extras={"feature_map": features})
