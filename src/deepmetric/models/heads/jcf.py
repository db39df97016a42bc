"""JCF: Joint Codebook Factorization (``--head jcf``, thesis §4.3, ICIP 2019).

Local features ``x`` (the trunk's output F, reduced by a 1x1 convolution without bias to ``reduce_dim``)
are softly assigned to a dictionary ``{d_n}`` (eq. 4.11): ``h_n(x) = softmax_n(-α ||x - d_n||²)``. The
codebook second-order representation ``sum_x h(x) ⊗ h(x) ⊗ x ⊗ x`` (eq. 4.12) is projected to D dimensions
without ever being built:

- JCF-N (eq. 4.18): ``z_i(x) = (h(x)^T U_i^T x) (h(x)^T V_i^T x)``, ``U_i, V_i ∈ R^{d x N}`` (``rank=None``);
- JCF-N-R (eq. 4.22): ``z_i(x) = (h(x)^T A Ũ_i^T x) (h(x)^T B Ṽ_i^T x)``, ``A, B ∈ R^{N x R}`` shared
  across the D outputs, ``Ũ_i, Ṽ_i ∈ R^{d x R}`` (``rank=R``);

then ``z = sum_x z(x)`` over the locations (eq. 4.13) and l2 (a sum and a mean give the same embedding).
Both factors are computed as ``(g ⊗ x)^T vec(U)`` with ``g = h`` (JCF-N) or ``g = h^T A`` (JCF-N-R), one
matrix product per factor. ``factorization="none"`` is the naive "BP + codebook" of Table 4.2: the full
``sum_x h(x) ⊗ x ⊗ x`` (N d² values), signed square root, l2, then a linear layer to D.

Decisions the thesis leaves open (documented defaults): the assignment is computed on the reduced
features; one dictionary is shared by both factors; the dictionary is initialised by k-means on the
reduced local features of ``init_images`` training images before training (``Head.initialize``, called
by the trainer), and when ``alpha`` is None it is set then as NetVLAD does, so that at the mean gap
between a feature's two nearest codewords the second gets 1/100 of the first's weight:
``α = ln(100) / mean(||x - d_(2)||² - ||x - d_(1)||²)``; α stays fixed during training. Parameter counts
(``reduce_dim=256``, D = 512, 2048-channel features) reproduce Table 4.2: ``2 D d N`` (JCF-N),
``2 D d R + 2 N R`` (JCF-N-R), plus ``2048 x 256`` for the reduction.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...errors import ConfigError
from ..backbones import Backbone
from ..high_order.matrix import signed_sqrt
from .base import Head, HeadOutput, check_embedding_dim
from .registry import HEADS
from .second_order import reduction


def soft_assignment(x: torch.Tensor, dictionary: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """(n, d), (N, d) -> (n, N): ``softmax_n(-α ||x - d_n||²)`` (eq. 4.11)."""
    distances = (x.square().sum(1, keepdim=True) - 2 * x @ dictionary.t() + dictionary.square().sum(1))
    return torch.softmax(-alpha * distances, dim=1)


def jcf_pool(x: torch.Tensor, g_left: torch.Tensor, g_right: torch.Tensor, u: torch.Tensor,
             v: torch.Tensor) -> torch.Tensor:
    """Sum over locations of ``z_i(x) = (g_left(x)^T U_i^T x)(g_right(x)^T V_i^T x)`` (eq. 4.18 / 4.22).

    x (B, L, d); g_* (B, L, M) per-location weights of the M projectors; u, v (M, d, D) with
    ``u[m, :, i]`` the m-th projector of output i. Returns (B, D).
    """
    b, length, d = x.shape
    m = g_left.shape[2]
    left = (g_left[..., :, None] * x[..., None, :]).reshape(b * length, m * d) @ u.reshape(m * d, -1)
    right = (g_right[..., :, None] * x[..., None, :]).reshape(b * length, m * d) @ v.reshape(m * d, -1)
    return (left * right).view(b, length, -1).sum(dim=1)


@HEADS.register("jcf")
class JCFHead(Head):
    alpha: torch.Tensor  # a buffer (register_buffer)

    def __init__(self, in_channels: int, embedding_dim: int = 512, codewords: int = 32, rank: int | None = None,
                 reduce_dim: int | None = 256, alpha: float | None = None, factorization: str = "jcf",
                 init_images: int = 512):
        super().__init__()
        if factorization not in ("jcf", "none"):
            raise ConfigError(f"head 'jcf': factorization must be 'jcf' or 'none', got '{factorization}'")
        if codewords < 1 or (rank is not None and rank < 1):
            raise ConfigError(f"head 'jcf': codewords and rank must be positive, got {codewords}, {rank}")
        if rank is not None and factorization == "none":
            raise ConfigError("head 'jcf': rank (JCF-N-R) needs factorization=jcf")
        self.embedding_dim, self.codewords, self.rank = check_embedding_dim("jcf", embedding_dim), codewords, rank
        self.factorization, self.init_images, self.auto_alpha = factorization, init_images, alpha is None
        self.feature_channels = in_channels
        self.reduce, d = reduction(in_channels, reduce_dim)
        self.dictionary = nn.Parameter(torch.randn(codewords, d))
        self.register_buffer("alpha", torch.tensor(1.0 if alpha is None else float(alpha)))
        if factorization == "none":
            self.embed = nn.Linear(codewords * d * d, embedding_dim, bias=False)
            return
        projectors = codewords if rank is None else rank
        scale = 1.0 / math.sqrt(d)
        self.u = nn.Parameter(torch.randn(projectors, d, embedding_dim) * scale)
        self.v = nn.Parameter(torch.randn(projectors, d, embedding_dim) * scale)
        if rank is not None:
            self.a = nn.Parameter(torch.randn(codewords, rank) / math.sqrt(codewords))
            self.b = nn.Parameter(torch.randn(codewords, rank) / math.sqrt(codewords))

    @classmethod
    def from_backbone(cls, backbone: Backbone, embedding_dim: int, **options: Any) -> JCFHead:
        return cls(in_channels=backbone.channels, embedding_dim=embedding_dim, **options)

    def local_features(self, features: torch.Tensor) -> torch.Tensor:
        """(B, C, h, w) -> (B, hw, d): the reduced local features."""
        x = self.reduce(features)
        return x.permute(0, 2, 3, 1).reshape(x.shape[0], -1, x.shape[1])

    @torch.no_grad()
    def initialize(self, feature_batches: Iterable[torch.Tensor]) -> None:
        """k-means dictionary on the reduced local features of training images (and α, when automatic)."""
        from sklearn.cluster import KMeans

        points = torch.cat([self.local_features(f).flatten(0, 1).float().cpu() for f in feature_batches]).numpy()
        if len(points) < self.codewords:
            raise ConfigError(f"head 'jcf': {len(points)} local features cannot initialise {self.codewords} codewords")
        kmeans = KMeans(n_clusters=self.codewords, n_init=1, random_state=0).fit(points)
        self.dictionary.copy_(torch.as_tensor(kmeans.cluster_centers_, dtype=self.dictionary.dtype))
        if self.auto_alpha and self.codewords > 1:
            distances = np.sort(kmeans.transform(points) ** 2, axis=1)
            gap = float(np.mean(distances[:, 1] - distances[:, 0]))
            self.alpha.fill_(math.log(100.0) / max(gap, 1e-12))

    def forward(self, features: torch.Tensor) -> HeadOutput:
        x = self.local_features(features)  # (B, L, d)
        b, length, d = x.shape
        h = soft_assignment(x.reshape(b * length, d), self.dictionary, self.alpha).view(b, length, -1)
        if self.factorization == "none":  # sum_x h(x) ⊗ x ⊗ x, then SSR + l2 + linear
            z = torch.einsum("bln,blc,bld->bncd", h, x, x).flatten(1)
            z = self.embed(F.normalize(signed_sqrt(z), dim=1))
        elif self.rank is None:
            z = jcf_pool(x, h, h, self.u, self.v)
        else:
            z = jcf_pool(x, h @ self.a, h @ self.b, self.u, self.v)
        embedding = F.normalize(z, dim=1)
        return HeadOutput(embedding=embedding, parts=[embedding], extras={"feature_map": features})
