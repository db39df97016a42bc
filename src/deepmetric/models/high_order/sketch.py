"""Tensor Sketch (Pham & Pagh 2013; thesis §3.4, eq. 3.46-3.48): a D-dimensional feature map whose inner
products estimate ``<x, y>^2`` without ever forming ``x x^T``.

Two count sketches ``ψ_k(x)_j = sum_{t: h_k(t) = j} s_k(t) x_t`` with random hashes ``h_k: [c] -> [D]``
and signs ``s_k ∈ {±1}^c``, combined by a circular convolution computed with FFTs:
``φ(x) = FFT^{-1}(FFT(ψ_1(x)) ⊙ FFT(ψ_2(x)))``, and ``E[<φ(x), φ(y)>] = <x, y>^2``. Not learned: the
hashes and signs are fixed buffers drawn from ``seed``.
"""

from __future__ import annotations

import torch
from torch import nn


def count_sketch_matrix(in_features: int, dim: int, generator: torch.Generator) -> torch.Tensor:
    """(c, D) matrix with one ±1 per row at a random column: ``x @ C`` is the count sketch of x."""
    rows = torch.arange(in_features)
    columns = torch.randint(0, dim, (in_features,), generator=generator)
    signs = torch.randint(0, 2, (in_features,), generator=generator).float() * 2 - 1
    matrix = torch.zeros(in_features, dim)
    matrix[rows, columns] = signs
    return matrix


class TensorSketch(nn.Module):
    """(n, c) -> (n, D): the Tensor Sketch of ``x ⊗ x``."""

    sketch1: torch.Tensor  # buffers (register_buffer)
    sketch2: torch.Tensor

    def __init__(self, in_features: int, dim: int, seed: int = 0):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.dim = dim
        self.register_buffer("sketch1", count_sketch_matrix(in_features, dim, generator), persistent=False)
        self.register_buffer("sketch2", count_sketch_matrix(in_features, dim, generator), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spectrum = torch.fft.rfft(x @ self.sketch1, dim=-1) * torch.fft.rfft(x @ self.sketch2, dim=-1)
        return torch.fft.irfft(spectrum, n=self.dim, dim=-1)
