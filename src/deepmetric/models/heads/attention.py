"""The multi-branch attention machinery shared by DIABLO and ABE.

trunk F -> attention network phi -> N attention maps A -> merge -> tail psi on every branch -> GAP ->
embedding of size D/N per branch -> l2 -> concatenation (DIABLO thesis §4.4, Fig. 4.3; ABE §3.3, Fig. 3):

- pre-attention (DIABLO eq. 3-4, ABE eq. 7): ``H_n = psi(A_n ⊙ F)``, psi shared across branches and run on
  all of them as one batch of B·N maps;
- post-attention (DIABLO eq. 1-2): ``H_n = A_n ⊙ psi(F)``.

The B·N batch of pre-attention is fed to psi in chunks of at most ``tail_chunk`` maps (``auto``: 64 on CPU,
unchunked on GPU), each pooled at once. Every layer of psi acts per image (BatchNorm frozen: the default),
so chunking changes no number; it keeps the working set of a CPU convolution in the regime where its time
per image is lowest (GoogLeNet's time per image grows about 1.5x from batch 32 to 128 on 2 CPU cores, see
docs/benchmarks/training-speed.md) and bounds the memory of the unpooled maps. With BatchNorm in training mode psi runs
unchunked, so that its batch statistics stay those of the whole B·N batch.

Attention maps have shape (B, N, c_A, h, w) with c_A = 1 (one weight per location, broadcast over the
channels: the Kronecker merge of eq. 8-9) or c_A = the channels of the map they weight (the Hadamard
merge of eq. 12-13). When phi changes the resolution (a backbone whose next scale downsamples), the maps
are resized bilinearly to the map they weight.

The concatenation of the N unit-norm branch embeddings is divided by sqrt(N), so the retrieval embedding
has unit norm and its cosine is the mean of the per-branch cosines.

``extras["feature_map"]`` is the trunk map F by default. With ``branch_feature_map`` it is the N branches'
maps H_n before pooling, concatenated on channels (B, N·C', h', w'), and ``feature_channels`` says N·C':
the input of HORDE on an attention ensemble (thesis §5.5.3, ABE + HORDE, whose code concatenates the 8
learners' inception-5b maps).
"""

from __future__ import annotations

import copy
import math
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import ConfigError
from ..backbones import Backbone
from ..init import glorot_uniform_
from .base import Head, HeadOutput, learner_dim

CPU_TAIL_CHUNK = 64


def check_tail_chunk(tail_chunk: int | str | None) -> int | str | None:
    positive_int = isinstance(tail_chunk, int) and not isinstance(tail_chunk, bool) and tail_chunk >= 1
    if tail_chunk is None or tail_chunk == "auto" or positive_int:
        return tail_chunk
    raise ConfigError(f"tail_chunk must be a positive integer, 'auto' or null, got {tail_chunk!r}")


def copy_stages(tail: nn.Module, names: tuple[str, ...]) -> nn.Sequential:
    """A separate copy (same pretrained weights, own parameters) of the named stages of ``tail``."""
    children = dict(tail.named_children())
    missing = [n for n in names if n not in children]
    if missing:
        raise ConfigError(f"the backbone's tail has no stage(s) {missing} to copy for the attention network; its "
                          f"stages are {list(children)}")
    return nn.Sequential(OrderedDict((n, copy.deepcopy(children[n])) for n in names))


def phi_channels(backbone: Backbone, names: tuple[str, ...]) -> int:
    return backbone.stage_channels[names[-1]]


class FeatureWiseSelection(nn.Module):
    """DIABLO feature-wise selection (paper eq. 5-7; thesis eq. 4.28-4.30).

    ``A^(n)_ij = softmax_n(alpha * cos(phi(f_ij), d^(n)))``: one weight per location and dictionary entry,
    the same for every channel. Returns (B, N, 1, h, w).
    """

    def __init__(self, num_entries: int, phi_dim: int, alpha: float):
        super().__init__()
        self.alpha = alpha
        self.dictionary = nn.Parameter(torch.randn(num_entries, phi_dim))  # (N, m)

    def similarity(self, phi_map: torch.Tensor) -> torch.Tensor:
        """cos(phi(f_ij), d^(n)) as (B, N, h, w) (eq. 5)."""
        return torch.einsum("bmhw,nm->bnhw", F.normalize(phi_map, dim=1), F.normalize(self.dictionary, dim=1))

    def forward(self, phi_map: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.alpha * self.similarity(phi_map), dim=1).unsqueeze(2)


class DimensionWiseSelection(nn.Module):
    """DIABLO dimension-wise selection (paper eq. 10-11; thesis eq. 4.33-4.34).

    A direction ``d^(n)_k`` per entry n and channel k of the weighted map:
    ``A^(n)_ijk = softmax_n(alpha * cos(phi(f_ij), d^(n)_k))``, the softmax over entries taken separately
    for every channel. Returns (B, N, c, h, w).
    """

    def __init__(self, num_entries: int, channels: int, phi_dim: int, alpha: float):
        super().__init__()
        self.alpha = alpha
        self.dictionary = nn.Parameter(torch.randn(num_entries, channels, phi_dim))  # (N, c, m)

    def similarity(self, phi_map: torch.Tensor) -> torch.Tensor:
        """cos(phi(f_ij), d^(n)_k) as (B, N, c, h, w) (eq. 10)."""
        return torch.einsum("bmhw,ncm->bnchw", F.normalize(phi_map, dim=1), F.normalize(self.dictionary, dim=2))

    def forward(self, phi_map: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.alpha * self.similarity(phi_map), dim=1)


class SigmoidMasks(nn.Module):
    """ABE's per-learner attention heads A'_m: one 1x1 convolution (with bias) + sigmoid per learner,
    giving a mask in [0, 1] with the shape of the features it weights (ABE §4, Fig. 3). Returns (B, M, c, h, w).

    Each learner's convolution is Glorot-initialised with its own fans, phi_dim -> c (ABE §4: "the convolution
    layer of attention module [is] randomly initialized as proposed by Glorot et al."), and its bias is zero
    (the paper does not say; zero is Keras' and Caffe's default)."""

    def __init__(self, num_learners: int, phi_dim: int, channels: int):
        super().__init__()
        self.num_learners, self.channels = num_learners, channels
        self.convs = nn.Conv2d(phi_dim, num_learners * channels, kernel_size=1)  # M convs as one
        glorot_uniform_(self.convs.weight, phi_dim, channels)
        assert self.convs.bias is not None  # built with Conv2d's default bias=True
        nn.init.zeros_(self.convs.bias)

    def forward(self, phi_map: torch.Tensor) -> torch.Tensor:
        b, _, h, w = phi_map.shape
        return torch.sigmoid(self.convs(phi_map)).view(b, self.num_learners, self.channels, h, w)


class BranchEmbedding(nn.Module):
    """Pooled branch features (B, N, C) -> per-branch l2-normalised embeddings of size D/N.

    ``shared``: one linear map for all branches (ABE's shared final layer); otherwise one per branch
    (DIABLO's "embedding layer for each branch"; same parameter count as one C x D layer). No bias.
    ``glorot``: Glorot-uniform (ABE §4: "the final layer of the network ... randomly initialized as proposed
    by Glorot et al."), else nn.Linear's default U(±1/sqrt(C)) (DIABLO does not say).
    """

    def __init__(self, num_branches: int, in_channels: int, embedding_dim: int, shared: bool, glorot: bool = False,
                 head: str = "attention head"):
        super().__init__()
        self.shared = shared
        out = learner_dim(head, embedding_dim, num_branches)
        self.embedding_dim = out * num_branches
        shape = (out, in_channels) if shared else (num_branches, out, in_channels)
        self.weight = nn.Parameter(torch.empty(shape))
        if glorot:
            glorot_uniform_(self.weight, in_channels, out)
        else:
            bound = 1.0 / math.sqrt(in_channels)  # nn.Linear's default initialisation
            nn.init.uniform_(self.weight, -bound, bound)

    def forward(self, pooled: torch.Tensor) -> list[torch.Tensor]:
        if self.shared:
            projected = pooled @ self.weight.t()  # (B, N, D/N)
        else:
            projected = torch.einsum("bnc,ndc->bnd", pooled, self.weight)
        return list(F.normalize(projected, dim=2).unbind(dim=1))


class MultiBranchHead(Head):
    """N attention branches over a shared tail; subclasses provide ``phi`` and ``selector``.

    ``forward`` returns the concatenated embedding (divided by sqrt(N)), the N branch embeddings as
    ``parts``, the channel-mean attention maps (B, N, h, w) as ``attention`` and, as ``extras["feature_map"]``,
    the trunk map F or, with ``branch_feature_map``, the branches' maps (module docstring).
    """

    pretrained_modules = ("phi", "psi")
    has_attention_maps = True

    def __init__(self, psi: nn.Module, phi: nn.Module, selector: nn.Module, num_branches: int, psi_channels: int,
                 embedding_dim: int, strategy: str, shared_embedding: bool, tail_chunk: int | str | None = "auto",
                 branch_feature_map: bool = False, glorot_embedding: bool = False, merge_scale: float = 1.0):
        super().__init__()
        self.merge_scale = merge_scale  # the pre-attention merge is merge_scale * (F ⊙ A) (DIABLO's compensation)
        if strategy not in ("pre", "post"):
            raise ConfigError(f"attention strategy must be 'pre' or 'post', got '{strategy}'")
        self.psi, self.phi, self.selector = psi, phi, selector
        self.tail_chunk = check_tail_chunk(tail_chunk)
        self.num_branches, self.strategy = num_branches, strategy
        self.embed = BranchEmbedding(num_branches, psi_channels, embedding_dim, shared_embedding, glorot_embedding,
                                     type(self).__name__)
        self.embedding_dim = self.embed.embedding_dim
        self.branch_feature_map = branch_feature_map
        if branch_feature_map:
            self.feature_channels = num_branches * psi_channels

    @property
    def num_parts(self) -> int:
        return self.num_branches

    def attention_maps(self, features: torch.Tensor, size: tuple[int, ...]) -> torch.Tensor:
        """A = selector(phi(F)), resized to ``size``: (B, N, c_A, h, w)."""
        maps = self.selector(self.phi(features))
        if tuple(maps.shape[-2:]) != tuple(size):
            b, n, c = maps.shape[:3]
            maps = F.interpolate(maps.flatten(1, 2), size=size, mode="bilinear", align_corners=False)
            maps = maps.view(b, n, c, *size)
        return maps

    def branch_features(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Pooled features of every branch (B, N, C'), the attention maps (B, N, c_A, h, w) and, with
        ``branch_feature_map``, the branches' maps before pooling (B, N, C', h', w'), else None."""
        b = features.shape[0]
        if self.strategy == "pre":
            maps = self.attention_maps(features, features.shape[-2:])
            merged = (features.unsqueeze(1) * maps).flatten(0, 1)  # (B·N, c, h, w): eq. 3 / eq. 13
            if self.merge_scale != 1.0:
                merged = merged * self.merge_scale
            pooled, unpooled = self.pooled_tail(merged)  # eq. 4 on all branches
            branch_maps = unpooled.unflatten(0, (b, self.num_branches)) if unpooled is not None else None
            return pooled.view(b, self.num_branches, -1), maps, branch_maps
        refined = self.psi(features)  # (B, C', h', w'): eq. 1
        maps = self.attention_maps(features, refined.shape[-2:])
        branch_maps = refined.unsqueeze(1) * maps  # eq. 2
        return branch_maps.mean(dim=(3, 4)), maps, branch_maps if self.branch_feature_map else None

    def chunk_size(self, batch: torch.Tensor) -> int | None:
        """Maps per psi call: None (all at once) when ``tail_chunk`` is None, on GPU under ``auto``, or when a
        BatchNorm of psi is in training mode (its statistics would depend on the chunking)."""
        if self.tail_chunk is None or any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training
                                          for m in self.psi.modules()):
            return None
        if isinstance(self.tail_chunk, str):  # "auto", the one word check_tail_chunk lets through
            return CPU_TAIL_CHUNK if batch.device.type == "cpu" else None
        return self.tail_chunk

    def pooled_tail(self, merged: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """GAP(psi(merged)), (B·N, C'), in chunks (see the module docstring), and with ``branch_feature_map``
        psi(merged) itself (B·N, C', h', w'), else None."""
        chunk = self.chunk_size(merged)
        pooled, kept = [], []
        for part in [merged] if chunk is None or merged.shape[0] <= chunk else merged.split(chunk):
            out = self.psi(part)
            pooled.append(out.mean(dim=(2, 3)))
            if self.branch_feature_map:
                kept.append(out)  # otherwise each chunk's maps are freed once pooled
        return torch.cat(pooled), torch.cat(kept) if kept else None

    def forward(self, features: torch.Tensor) -> HeadOutput:
        pooled, maps, branch_maps = self.branch_features(features)
        parts = self.embed(pooled)
        embedding = torch.cat(parts, dim=1) / math.sqrt(self.num_branches)
        feature_map = branch_maps.flatten(1, 2) if branch_maps is not None else features
        return HeadOutput(embedding=embedding, parts=parts, attention=maps.mean(dim=2),
                          extras={"feature_map": feature_map})
