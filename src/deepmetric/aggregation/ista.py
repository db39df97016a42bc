"""ISTA: Improved Spatial Tensor Aggregation (thesis §4.2, ICIP 2018), an off-the-shelf signature for
instance retrieval from a feature map (h, w, c) of a pretrained CNN. Nothing is trained by gradient.

1. **Dictionary and hard assignment**: k-means with N codewords; each local feature x goes to its
   nearest codeword, ``I_k`` = the features assigned to k.
2. **Neighbour pairs** ``(x, x_u)`` with ``x_u ∈ Ω(x)``; ``V_l(x)`` = the neighbours assigned to l. The thesis
   does not define Ω: the default is the **4-neighbourhood** (the feature above, below, left and right;
   every ordered pair, so each adjacent pair counts in both directions; the feature itself excluded).
   ``"8"`` adds the diagonals; ``"self"`` (Ω(x) = {x}) drops the spatial information, which turns the
   pair tensors into per-codeword second-order moments (the VLAT/JCF relation of §4.5).
3. **Centering and alignment** (eq. 4.3-4.6): the mean pair tensor ``T̃_kl = mean x x_u^T`` over the
   fitting pairs, its SVD ``T̃_kl = U L V^T`` truncated adaptively to the fewest components keeping a
   fraction ``variance`` of its energy ``sum σ²`` (the same count on both sides), and per image
   ``S_kl = U^T (sum_{pairs} x x_u^T) V - n_kl L``: eq. 4.4 subtracts ``T̃_kl`` once per pair (n_kl pairs),
   which eq. 4.6 abbreviates as ``- L``; so a pair of codewords absent from the image gives a zero block.
4. **Normalisation** (§4.2.4): signed power ``power`` (0.5), then eq. 4.7, which divides every component
   ``s_kl(i, j)`` by ``sqrt(sum_n s_nn(i, j)²)`` for diagonal pairs (k = l) and by
   ``sqrt(sum_{n≠m} s_nm(i, j)²)`` for the others, then l2 over the whole signature. Eq. 4.7 scales every
   component to unit size across pairs, however small; a component whose norm is below 1e-6 of the
   largest is set to 0 instead, so that float round-off is not blown up to the size of real signal.
5. **Two-step reduction** (§4.2.5, eq. 4.8): for each pair, the Gram matrix ``G = S S^T = V L V^T`` of
   its normalised blocks over M images gives ``P_kl = L^{-1/2} V^T S`` (kept: ``block_fraction`` of the
   block's dimension). The thesis writes ``L^{1/2}``, but it states the aim of keeping inner products,
   which ``L^{-1/2}`` does (the projection on the block's top principal directions) and ``L^{1/2}``
   does not; and no whitening may happen at this stage. Then the same on the concatenated reduced
   blocks of a second image set, with **whitening**: ``P = L^{-1} V^T B``, keeping ``dim`` components,
   and a final l2.

The thesis sums the signatures of two resolutions (512 and 1024 px); encode both maps and add the results.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import ConfigError

NEIGHBOURHOODS = {
    "4": [(-1, 0), (1, 0), (0, -1), (0, 1)],
    "8": [(-1, 0), (1, 0), (0, -1), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1)],
    "self": [(0, 0)],
}


def neighbour_pairs(feature_map: np.ndarray, neighbourhood: str = "4") -> tuple[np.ndarray, np.ndarray]:
    """``(x, x_u)`` rows (P, c) and (P, c) for every location x of an (h, w, c) map and every x_u ∈ Ω(x)."""
    if neighbourhood not in NEIGHBOURHOODS:
        raise ConfigError(f"ISTA: neighbourhood must be one of {', '.join(NEIGHBOURHOODS)}, got '{neighbourhood}'")
    h, w, _ = feature_map.shape
    first, second = [], []
    for dy, dx in NEIGHBOURHOODS[neighbourhood]:
        ys, xs = slice(max(0, -dy), h - max(0, dy)), slice(max(0, -dx), w - max(0, dx))
        us, ux = slice(max(0, dy), h - max(0, -dy)), slice(max(0, dx), w - max(0, -dx))
        first.append(feature_map[ys, xs].reshape(-1, feature_map.shape[2]))
        second.append(feature_map[us, ux].reshape(-1, feature_map.shape[2]))
    return np.concatenate(first), np.concatenate(second)


def _gram_projection(rows: np.ndarray, keep: int, exponent: float) -> np.ndarray:
    """``L^exponent V^T S`` (keep, D) from the eigendecomposition of the Gram matrix ``S S^T`` of rows (M, D)."""
    values, vectors = np.linalg.eigh(rows @ rows.T)
    order = np.argsort(values)[::-1]
    values, vectors = values[order], vectors[:, order]
    keep = min(keep, int((values > values[0] * 1e-10).sum()) if values[0] > 0 else 0)
    return (values[:keep] ** exponent)[:, None] * (vectors[:, :keep].T @ rows)


class ISTA:
    def __init__(self, codewords: int = 32, neighbourhood: str = "4", variance: float = 0.8, power: float = 0.5,
                 block_fraction: float | None = 0.4, dim: int | None = None, seed: int = 0):
        if neighbourhood not in NEIGHBOURHOODS:
            raise ConfigError(f"ISTA: neighbourhood must be one of {', '.join(NEIGHBOURHOODS)}, got '{neighbourhood}'")
        if not 0 < variance <= 1 or (block_fraction is not None and not 0 < block_fraction <= 1):
            raise ConfigError(f"ISTA: variance and block_fraction must be in (0, 1], got {variance}, {block_fraction}")
        if dim is not None and block_fraction is None:
            raise ConfigError("ISTA: dim (the whitened full projection, §4.2.5) projects block-reduced signatures; "
                              "set block_fraction as well")
        self.codewords, self.neighbourhood, self.variance, self.power = codewords, neighbourhood, variance, power
        self.block_fraction, self.dim, self.seed = block_fraction, dim, seed
        self.dictionary: np.ndarray | None = None
        self.bases: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.block_projections: dict[tuple[int, int], np.ndarray] = {}
        self.full_projection: np.ndarray | None = None

    # -- fitting -------------------------------------------------------------------------------------------
    def fit(self, maps: Sequence[np.ndarray], block_maps: Sequence[np.ndarray] | None = None,
            full_maps: Sequence[np.ndarray] | None = None) -> ISTA:
        """Dictionary and pair bases on ``maps``; block projections on ``block_maps`` and the whitened full
        projection on ``full_maps`` (each defaults to ``maps``; the thesis uses three image sets)."""
        from sklearn.cluster import KMeans

        points = np.concatenate([m.reshape(-1, m.shape[2]) for m in maps]).astype(np.float64)
        if len(points) < self.codewords:
            raise ConfigError(f"ISTA: {len(points)} local features cannot fit {self.codewords} codewords")
        self.dictionary = KMeans(self.codewords, n_init=3, random_state=self.seed).fit(points).cluster_centers_
        self._fit_bases(maps)
        self.block_projections, self.full_projection = {}, None
        if self.block_fraction is not None:
            blocks = [self.signature_blocks(m) for m in (block_maps or maps)]
            for pair, (u, _, _) in self.bases.items():
                rows = np.stack([b[pair].ravel() for b in blocks])
                keep = int(np.ceil(self.block_fraction * u.shape[1] ** 2))
                self.block_projections[pair] = _gram_projection(rows, keep, -0.5)
        if self.dim is not None:
            reduced = np.stack([self._block_reduce(self.signature_blocks(m)) for m in (full_maps or maps)])
            self.full_projection = _gram_projection(reduced, self.dim, -1.0)  # whitened
        return self

    def _fit_bases(self, maps: Sequence[np.ndarray]) -> None:
        sums: dict[tuple[int, int], np.ndarray] = {}
        counts: dict[tuple[int, int], int] = {}
        for m in maps:
            for pair, (x, xu) in self._grouped_pairs(m).items():
                sums[pair] = sums.get(pair, 0) + x.T @ xu
                counts[pair] = counts.get(pair, 0) + len(x)
        self.bases = {}
        for pair in sorted(sums):
            u, s, vt = np.linalg.svd(sums[pair] / counts[pair])
            energy = np.cumsum(s**2) / max(float((s**2).sum()), 1e-300)
            r = int(np.searchsorted(energy, self.variance - 1e-12) + 1)
            self.bases[pair] = (u[:, :r], s[:r], vt[:r].T)

    # -- encoding ------------------------------------------------------------------------------------------
    def assign(self, x: np.ndarray) -> np.ndarray:
        """Hard assignment: the index of the nearest codeword of each row of x (n, c)."""
        if self.dictionary is None:
            raise ConfigError("ISTA: call fit() before encoding")
        distances = (x**2).sum(1)[:, None] - 2 * x @ self.dictionary.T + (self.dictionary**2).sum(1)
        return distances.argmin(axis=1)

    def _grouped_pairs(self, feature_map: np.ndarray) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]:
        x, xu = neighbour_pairs(np.asarray(feature_map, dtype=np.float64), self.neighbourhood)
        k, l = self.assign(x), self.assign(xu)
        groups = {}
        for pair in set(zip(k.tolist(), l.tolist(), strict=True)):
            rows = (k == pair[0]) & (l == pair[1])
            groups[pair] = (x[rows], xu[rows])
        return groups

    def centred_blocks(self, feature_map: np.ndarray) -> dict[tuple[int, int], np.ndarray]:
        """``S_kl = U^T (sum x x_u^T) V - n_kl L`` (r x r) for every fitted pair (eq. 4.4-4.6)."""
        groups = self._grouped_pairs(feature_map)
        blocks = {}
        for pair, (u, s, v) in self.bases.items():
            if pair in groups:
                x, xu = groups[pair]
                blocks[pair] = (x @ u).T @ (xu @ v) - len(x) * np.diag(s)
            else:
                blocks[pair] = np.zeros((len(s), len(s)))
        return blocks

    def signature_blocks(self, feature_map: np.ndarray) -> dict[tuple[int, int], np.ndarray]:
        """The normalised blocks: signed power, eq. 4.7 across pairs (diagonal / off-diagonal apart), l2."""
        blocks = {p: np.sign(b) * np.abs(b) ** self.power for p, b in self.centred_blocks(feature_map).items()}
        size = max(b.shape[0] for b in blocks.values())
        norms = {}
        for diagonal in (True, False):
            squares = np.zeros((size, size))
            for p, b in blocks.items():
                if (p[0] == p[1]) == diagonal:
                    squares[: len(b), : len(b)] += b**2
            norms[diagonal] = np.sqrt(squares)
        floor = 1e-6 * max(float(n.max()) for n in norms.values())
        for p, b in blocks.items():
            norm = norms[p[0] == p[1]][: len(b), : len(b)]
            blocks[p] = np.divide(b, norm, out=np.zeros_like(b), where=(norm > floor) & (norm > 0))
        total = np.sqrt(sum(float((b**2).sum()) for b in blocks.values()))
        return {p: b / total if total > 0 else b for p, b in blocks.items()}

    def signature(self, feature_map: np.ndarray) -> np.ndarray:
        """The raw (unreduced) signature: all normalised blocks, concatenated in pair order."""
        return np.concatenate([b.ravel() for b in self.signature_blocks(feature_map).values()])

    def _block_reduce(self, blocks: dict[tuple[int, int], np.ndarray]) -> np.ndarray:
        return np.concatenate([self.block_projections[p] @ blocks[p].ravel() for p in self.bases])

    def encode(self, feature_map: np.ndarray) -> np.ndarray:
        """The final l2-normalised signature of an (h, w, c) map (reduced as far as the fit went)."""
        blocks = self.signature_blocks(feature_map)
        if not self.block_projections:
            return np.concatenate([b.ravel() for b in blocks.values()])
        vector = self._block_reduce(blocks)
        if self.full_projection is not None:
            vector = self.full_projection @ vector
        norm = np.linalg.norm(vector)
        return vector / norm if norm > 0 else vector
