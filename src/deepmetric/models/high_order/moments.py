"""Random Maclaurin approximations of the high-order moments of local features (thesis §3.4, §5.3.1).

For one local feature ``x`` (c) and matrices ``W_1..W_k`` (c x d), eq. 5.4:
``phi_k(x) = (W_1^T x) ⊙ (W_2^T x) ⊙ ... ⊙ (W_k^T x)`` in R^d, and with Rademacher (±1) matrices
``E[(1/d) <phi_k(x), phi_k(y)>] = <x, y>^k = <x^{⊗k}, y^{⊗k}>`` (eq. 5.2, 5.5). The maps are computed at
every location of a feature map with 1x1 projections (one matrix product over all locations) and
averaged over the locations **after** the products (eq. 5.8: the empirical moment ``mean_i phi_k(x_i)``,
not ``phi_k(mean_i x_i)``).

Modes (thesis Tables 5.3-5.5, code ``KOrderModel`` / ``CascadedKOrder``):

- ``cascaded`` (Algorithm 1, eq. 5.6): ``phi_2 = (W_1^T x) ⊙ (W_2^T x)``, ``phi_k = phi_{k-1} ⊙ (W_k^T x)``:
  K learned matrices for orders 2..K;
- ``learned``: order k owns k learned matrices (eq. 5.4), ``sum_{k=2..K} k`` matrices in all;
- ``rm_fixed``: as ``learned`` with frozen Rademacher matrices (not parameters; regenerated from ``seed``).

Learned matrices start Glorot-uniform, as in the authors' code (±1 matrices are only used frozen there).
``scale=True`` multiplies every order by ``1/sqrt(d)`` (Algorithm 1, line 2: applied once at order 2
and inherited by the cascade) so that ``<phi_k(x), phi_k(y)>`` itself estimates ``<x, y>^k``; the
authors' code has no such factor, which is the default. The factor is a positive constant, so it
changes nothing after an l2 normalisation (see ``losses/horde.py``), only the range of the values.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ...errors import ConfigError
from ..init import glorot_uniform_

MODES = ("cascaded", "learned", "rm_fixed")


def rademacher(rows: int, cols: int, seed: int) -> torch.Tensor:
    """A (rows, cols) matrix of independent uniform ±1 entries, a pure function of ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, (rows, cols), generator=generator).float() * 2 - 1


def glorot_uniform(rows: int, cols: int, count: int) -> torch.Tensor:
    """``count`` (rows, cols) matrices side by side, each U(±sqrt(6 / (rows + cols))) (Keras' default)."""
    return glorot_uniform_(torch.empty(rows, cols * count), rows, cols)


def matrices_per_order(orders: int, mode: str) -> list[list[int]]:
    """Which matrices (indices into the stacked projections) each order k = 2..K multiplies."""
    if mode == "cascaded":
        return [list(range(k)) for k in range(2, orders + 1)]
    start, used = 0, []
    for k in range(2, orders + 1):
        used.append(list(range(start, start + k)))
        start += k
    return used


class HighOrderMoments(nn.Module):
    """``phi_k``, k = 2..``orders``, of every local feature, pooled after the products (eq. 5.4-5.8).

    ``forward(feature_map (B, c, h, w)) -> [m_2, ..., m_K]``, each (B, d) with
    ``m_k = (1/hw) sum_i phi_k(x_i)``. ``locations(x (n, c))`` gives the unpooled ``phi_k(x)`` (n, d).
    """

    def __init__(self, in_channels: int, orders: int = 5, dim: int = 8192, mode: str = "cascaded",
                 scale: bool = False, seed: int = 0):
        super().__init__()
        if mode not in MODES:
            raise ConfigError(f"high-order moments: mode must be one of {', '.join(MODES)}, got '{mode}'")
        if orders < 2:
            raise ConfigError(f"high-order moments: orders must be at least 2 (orders 2..K), got {orders}")
        if dim < 1 or in_channels < 1:
            raise ConfigError(f"high-order moments: dim and in_channels must be positive, got {dim}, {in_channels}")
        self.in_channels, self.orders, self.dim, self.mode, self.scale = in_channels, orders, dim, mode, scale
        self.uses = matrices_per_order(orders, mode)
        self.num_matrices = max(max(u) for u in self.uses) + 1
        if mode == "rm_fixed":
            self.register_buffer("weight", rademacher(in_channels, dim * self.num_matrices, seed), persistent=False)
        else:
            self.weight = nn.Parameter(glorot_uniform(in_channels, dim, self.num_matrices))

    def projections(self, x: torch.Tensor) -> torch.Tensor:
        """(n, c) -> (n, M, d): ``W_m^T x`` for every matrix m, as one matrix product (the 1x1 convolutions)."""
        return (x @ self.weight).unflatten(-1, (self.num_matrices, self.dim))  # no len(x): a traced export keeps n free

    def locations(self, x: torch.Tensor) -> list[torch.Tensor]:
        """``[phi_2(x), ..., phi_K(x)]`` for local features x (n, c), each (n, d)."""
        p = self.projections(x)
        factor = 1.0 / math.sqrt(self.dim) if self.scale else 1.0
        if self.mode == "cascaded":  # Algorithm 1: phi_k = phi_{k-1} ⊙ W_k^T x
            phi = p[:, 0] * p[:, 1] * factor
            out = [phi]
            for k in range(2, self.orders):
                phi = phi * p[:, k]
                out.append(phi)
            return out
        out = []
        for used in self.uses:  # eq. 5.4 with each order's own matrices
            phi = p[:, used[0]] * factor
            for m in used[1:]:
                phi = phi * p[:, m]
            out.append(phi)
        return out

    def forward(self, feature_map: torch.Tensor) -> list[torch.Tensor]:
        b, c, h, w = feature_map.shape
        if c != self.in_channels:
            raise ConfigError(f"high-order moments were built for {self.in_channels}-channel features, got {c}")
        x = feature_map.permute(0, 2, 3, 1).reshape(b * h * w, c)  # a view for channels-last maps
        return [phi.view(b, h * w, self.dim).mean(dim=1) for phi in self.locations(x)]  # GAP after the products
