"""Second-order pooling and its normalisations (thesis §3.2-3.3).

Local features are columns of ``X`` (B, c, N):

- second-order pooling (eq. 3.1): ``Σ = (1/N) X X^T``;
- covariance pooling (eq. 3.2): ``Σ = (1/N) X X^T - μ μ^T``;
- bilinear pooling of two streams (eq. 3.3): ``(1/N) X Y^T``;
- signed square root ``sign(v) sqrt(|v|)`` (the element-wise normalisation, followed by l2);
- matrix power ``U f(Δ) U^T`` with ``f(Δ) = Δ^α`` by eigendecomposition (eq. 3.28), with a backward that
  stays finite when eigenvalues coincide (below);
- the Newton-Schulz square root (eq. 3.42, iSQRT-COV): ``Y_{k+1} = ½ Y_k (3I - Z_k Y_k)``,
  ``Z_{k+1} = ½ (3I - Z_k Y_k) Z_k`` from ``Y_0 = Σ / tr Σ``, ``Z_0 = I`` (trace pre-normalisation, needed
  for convergence), then ``Y_K sqrt(tr Σ)`` (post-compensation). Only matrix products, differentiated by
  autograd. The thesis gives no iteration count; 5 is iSQRT-COV's.

The backward of the eigen route: for ``Q = U f(Δ) U^T`` and a symmetric ``G = sym(∂L/∂Q)``,
``∂L/∂Σ = U (L ∘ (U^T G U)) U^T`` with the Loewner matrix ``L_ij = (f(λ_i) - f(λ_j)) / (λ_i - λ_j)``, and
``L_ii = f'(λ_i)``. For distinct eigenvalues this is exactly eq. 3.29-3.33 (Ionescu et al.), whose
``K_ij = 1/(λ_i - λ_j)`` blows up as two eigenvalues meet; here the divided difference tends to
``f'`` instead, which is used for eigenvalues within a relative ``1e-6`` of each other.
"""

from __future__ import annotations

from typing import Any

import torch


def second_order(x: torch.Tensor) -> torch.Tensor:
    """(B, c, N) -> (B, c, c): ``(1/N) X X^T`` (eq. 3.1)."""
    return x @ x.transpose(1, 2) / x.shape[2]


def covariance(x: torch.Tensor) -> torch.Tensor:
    """(B, c, N) -> (B, c, c): ``(1/N) X X^T - μ μ^T`` (eq. 3.2)."""
    return second_order(x - x.mean(dim=2, keepdim=True))


def cross(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(B, c1, N), (B, c2, N) -> (B, c1, c2): ``(1/N) X Y^T`` (eq. 3.3, two-stream bilinear pooling)."""
    return x @ y.transpose(1, 2) / x.shape[2]


def signed_sqrt(v: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``sign(v) (sqrt(|v| + eps) - sqrt(eps))``: the signed square root with a finite slope at 0."""
    return torch.sign(v) * (torch.sqrt(v.abs() + eps) - eps**0.5)


def _eigen_power(sigma: torch.Tensor, power: float, eps: float) -> tuple[torch.Tensor, ...]:
    """(floored eigenvalues, eigenvectors, eigenvalues ** power, which were kept, U Δ^α U^T)."""
    eigenvalues, vectors = torch.linalg.eigh(sigma)
    floor = eps * eigenvalues.amax(dim=-1, keepdim=True).clamp_min(eps)
    kept = eigenvalues > floor
    eigenvalues = torch.where(kept, eigenvalues, floor)
    values = eigenvalues**power
    return eigenvalues, vectors, values, kept, vectors @ torch.diag_embed(values) @ vectors.transpose(-1, -2)


class _MatrixPower(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, sigma: torch.Tensor, power: float, eps: float) -> torch.Tensor:
        eigenvalues, vectors, values, kept, result = _eigen_power(sigma, power, eps)
        ctx.save_for_backward(eigenvalues, vectors, values, kept)
        ctx.power = power
        return result

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        eigenvalues, vectors, values, kept = ctx.saved_tensors
        slope = ctx.power * eigenvalues ** (ctx.power - 1) * kept  # f'(λ); 0 where λ was floored
        gap = eigenvalues[..., :, None] - eigenvalues[..., None, :]
        close = gap.abs() <= 1e-6 * eigenvalues.abs().amax(dim=-1, keepdim=True)[..., None]
        divided = (values[..., :, None] - values[..., None, :]) / torch.where(close, torch.ones_like(gap), gap)
        loewner = torch.where(close, (slope[..., :, None] + slope[..., None, :]) / 2, divided)
        g = (grad + grad.transpose(-1, -2)) / 2
        inner = vectors.transpose(-1, -2) @ g @ vectors
        return vectors @ (loewner * inner) @ vectors.transpose(-1, -2), None, None


def matrix_power(sigma: torch.Tensor, power: float = 0.5, eps: float = 1e-6) -> torch.Tensor:
    """``U Δ^α U^T`` of symmetric PSD matrices (..., c, c) (eq. 3.28); eigenvalues below ``eps`` times the
    largest are raised to that floor (rank-deficient Σ), and get no gradient. Without a gradient to compute the
    plain torch operations run, not the autograd Function, so that a traced model (TorchScript) can be saved."""
    if torch.is_grad_enabled() and sigma.requires_grad:
        return _MatrixPower.apply(sigma, power, eps)
    return _eigen_power(sigma, power, eps)[-1]


def newton_schulz_sqrt(sigma: torch.Tensor, iterations: int = 5) -> torch.Tensor:
    """Square root of SPD matrices (..., c, c) by Newton-Schulz (eq. 3.42) with trace pre-normalisation
    and post-compensation (iSQRT-COV)."""
    c = sigma.shape[-1]
    trace = sigma.diagonal(dim1=-2, dim2=-1).sum(-1)[..., None, None]
    eye = torch.eye(c, dtype=sigma.dtype, device=sigma.device).expand_as(sigma)
    y, z = sigma / trace, eye
    for _ in range(iterations):
        t = (3 * eye - z @ y) / 2
        y, z = y @ t, t @ z
    return y * trace.sqrt()
