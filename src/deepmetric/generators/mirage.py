"""MIRAGE: training-class and virtual-class example generation (Jacob, thesis ch. 6, §6.3).

Prototypes ``p`` live in the embedding space: one per training class (rows ``0 .. N_t-1``, the trainer's
contiguous labels) and ``N_v = round(virtual_ratio * N_t)`` virtual ones (rows ``N_t .. N_t+N_v-1``). A row's
index is its label, so a virtual example's label is ``N_t + v`` and never equals a training label.

- Encoder (eq. 6.1): ``x = E(f) = W^T f / ||W^T f||_2``, the head's own ``encode`` on its pooled vector f
  (``Head.pooled_dim``, ``extras["pooled"]``; the GAP head is exactly eq. 6.1). A head without a pooled-vector
  encoder (attention heads: the embedding is not a function of one vector) falls back to its embedding space as
  the feature space: f = the embedding and E = l2 (no parameters).
- Generation (eq. 6.2): ``x~ = E(G(n(p + eps)))``, ``eps ~ N(0, Sigma)``, ``n`` = l2 normalisation; G is two
  fully connected layers with a ReLU between them (``generator_hidden`` wide; the output goes through a ReLU
  too for the pooled path, since pooled ReLU features are non-negative, and is linear for the fallback).
- Reconstruction (eq. 6.3, ElasticNet): ``L_rec = ||f - G(E(f))||_1 + ||f - G(E(f))||_2^2`` per example, averaged.
- Discriminator: FC + ReLU, then D_g (one logit, sigmoid: real vs generated) and D_c (N_t + N_v logits, softmax:
  the class). Its input is the embedding E(.) (the equation; the prose says "feature vectors").
- Adversarial loss (unnumbered, §6.3.4): ``L_adv = -log D_g(E(f_t)) - log(1 - D_g(x~_v)) - y_t log D_c(E(f_t))
  - y_v log D_c(x~_v)``.

Who minimises what (§6.3.5, digest §2.2), one alternating round per training step:

1. ``generate``: x~_t (from the batch's classes, round robin) and x~_v (from ``n_v // virtual_per_class``
   randomly drawn virtual classes, at least ``virtual_per_class`` rows each; 0 = the real batch's K) go into the
   metric loss with their labels. Gradients of L_DML reach the backbone, E and the prototypes, and pass
   *through* G (whose parameters are detached here: G gets no L_DML gradient).
2. ``step`` (after the trainer's metric step): D minimises L_adv on the real examples and fresh detached virtual
   examples; then G minimises ``L_rec - adversarial_weight * L_adv`` (it maximises L_adv with D fixed; E(f) is
   detached in L_rec, and E receives nothing from this step); the virtual prototypes also get that adversarial
   gradient when ``adversarial_prototypes`` ("we encourage the prototypes and the generator..."); finally the
   prototypes take their Adam step (L_DML + adversarial gradients). Each step differentiates only the parameters
   it updates (``torch.autograd.grad``), so the D step never touches G and the G step never touches D.

Batch composition: ``|B~| = round(batch_ratio * |B|)``; ``mode`` chooses where B~ comes from: ``tcg`` (training
classes only; Table 6.1 left, Table 6.2 "TCG"), ``virtual`` (virtual classes only; Table 6.1 right), ``both``
(MIRAGE; ``virtual_fraction`` of B~ from virtual classes) or ``none`` (no rows: the plain pipeline's training
step, while G still learns L_rec).

Where the thesis is silent (digest §7, items 15-21), the choices here, each an option: Sigma = (noise_std^2 / D) I,
so ``E||eps||^2 = noise_std^2`` (default 0.5, about 30 degrees around a unit prototype), fresh noise per generated
example from the generator's own seeded stream; G/D 512 wide; G/D trained with Adam (lr 1e-4, betas 0.5/0.999,
constant); prototypes with Adam at ``train.lr`` (``lr_prototypes``); prototypes initialised N(0, I/D) from
``seed``; "as proposed by [122] (Proxy-NCA) ... E and p_t are trained together using a DML loss": besides
entering L_DML through their generated examples, the prototypes of the batch's classes and of the drawn virtual
classes are appended as proxy rows with their labels (``prototype_rows``, l2-normalised like the embeddings; off
when nothing is generated); ``virtual_fraction`` = 0.5 in ``both``; ``gan_loss="minimax"``
(the text: G maximises L_adv) or ``"nonsaturating"`` (G minimises -log D_g(x~_v) - log(1 - D_c(x~_v)[y_v])).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from ..errors import ConfigError
from ..models.heads import Head, HeadOutput
from .base import GeneratedBatch, Generator
from .registry import GENERATORS

MODES = ("both", "tcg", "virtual", "none")


def reconstruction_loss(features: torch.Tensor, decoded: torch.Tensor) -> torch.Tensor:
    """Eq. 6.3 (ElasticNet): mean over examples of ``||f - G(E(f))||_1 + ||f - G(E(f))||_2^2``."""
    residual = (features - decoded).flatten(1)
    return (residual.abs().sum(1) + residual.pow(2).sum(1)).mean()


@dataclass(frozen=True)
class MirageOptions:
    """MIRAGE's hyper-parameters (``generator.options``), checked when built. Thesis ch. 6: ``batch_ratio``
    |B~| / |B|, ``virtual_ratio`` N_v / N_t, ``noise_std`` Sigma's scale (eq. 6.2), the losses' weights (eq. 6.5);
    the rest are choices the thesis leaves open (README, "MIRAGE")."""

    mode: str = "both"
    batch_ratio: float = 1.0
    virtual_ratio: float = 1.0
    virtual_fraction: float = 0.5
    virtual_per_class: int = 0
    noise_std: float = 0.5
    normalize_input: bool | None = None
    generator_hidden: int = 512
    generator_output: str | None = None
    discriminator_hidden: int = 512
    lr_generator: float = 1e-4
    lr_discriminator: float = 1e-4
    lr_prototypes: float | None = None
    betas: tuple[float, float] | list[float] = (0.5, 0.999)
    reconstruction_weight: float = 1.0
    adversarial_weight: float = 1.0
    gan_loss: str = "minimax"
    adversarial_prototypes: bool = True
    prototype_rows: bool = True
    diagnostic_images: int = 1000
    projection: str = "tsne"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"generator 'mirage': mode must be one of {', '.join(MODES)}, got '{self.mode}'")
        if self.gan_loss not in ("minimax", "nonsaturating"):
            raise ConfigError(f"generator 'mirage': gan_loss must be minimax or nonsaturating, got '{self.gan_loss}'")
        if self.projection not in ("tsne", "pca"):
            raise ConfigError(f"generator 'mirage': projection must be tsne or pca, got '{self.projection}'")
        if self.generator_output not in (None, "relu", "linear"):
            raise ConfigError(f"generator 'mirage': generator_output must be relu or linear, got "
                              f"'{self.generator_output}'")
        if self.batch_ratio < 0 or self.virtual_ratio < 0 or not 0 <= self.virtual_fraction <= 1 \
                or self.noise_std < 0:
            raise ConfigError("generator 'mirage': batch_ratio, virtual_ratio and noise_std must be >= 0 and "
                              f"virtual_fraction in [0, 1]; got {self.batch_ratio}, {self.virtual_ratio}, "
                              f"{self.noise_std}, {self.virtual_fraction}")


@GENERATORS.register("mirage")  # thesis ch. 6
class MirageGenerator(Generator):
    """Thesis ch. 6's generator of training-class and virtual-class examples; its options are ``MirageOptions``'
    fields, given as keywords (``generator.options.<name>``)."""

    @classmethod
    def option_names(cls) -> list[str]:
        return [f.name for f in fields(MirageOptions)]

    def __init__(self, head: Head, num_classes: int, batch_size: int, lr: float = 1e-5, seed: int = 0,
                 **options: Any):
        super().__init__()
        o = self.options = MirageOptions(**options)
        self.head = [head]  # a reference, not a sub-module: the head's weights belong to the model
        self.num_classes = int(num_classes)
        self.mode, self.batch_ratio, self.virtual_fraction = o.mode, float(o.batch_ratio), float(o.virtual_fraction)
        self.num_virtual = int(round(o.virtual_ratio * num_classes)) if o.mode in ("both", "virtual") else 0
        self.extra_classes = self.num_virtual
        self.virtual_per_class = int(o.virtual_per_class)
        self.pooled = head.pooled_dim is not None
        self.embedding_dim = int(head.embedding_dim)
        self.feature_dim = int(head.pooled_dim) if head.pooled_dim is not None else self.embedding_dim
        self.normalized = bool(head.normalized)
        self.normalize_input = self.normalized if o.normalize_input is None else bool(o.normalize_input)
        self.noise_std = float(o.noise_std)
        output = o.generator_output or ("relu" if self.pooled else "linear")
        self.reconstruction_weight, self.adversarial_weight = float(o.reconstruction_weight), float(
            o.adversarial_weight)
        self.gan_loss, self.adversarial_prototypes = o.gan_loss, bool(o.adversarial_prototypes)
        self.prototype_rows, self.diagnostic_images, self.projection = bool(o.prototype_rows), int(
            o.diagnostic_images), o.projection
        self.seed = int(seed)

        with torch.random.fork_rng(devices=[]):  # the model's random stream is left exactly as a plain run's
            torch.manual_seed(self.seed + 7919)
            d = self.embedding_dim
            self.prototypes = nn.Parameter(torch.randn(self.num_classes + self.num_virtual, d) / math.sqrt(d))
            layers: list[nn.Module] = [nn.Linear(d, o.generator_hidden), nn.ReLU(),
                                       nn.Linear(o.generator_hidden, self.feature_dim)]
            self.generator = nn.Sequential(*layers, *([nn.ReLU()] if output == "relu" else []))
            self.disc_trunk = nn.Sequential(nn.Linear(d, o.discriminator_hidden), nn.ReLU())
            self.disc_real = nn.Linear(o.discriminator_hidden, 1)
            self.disc_class = nn.Linear(o.discriminator_hidden, self.num_classes + self.num_virtual)
        self.noise = torch.Generator().manual_seed(self.seed + 104729)
        betas = (float(o.betas[0]), float(o.betas[1]))
        self.optimizers = {
            "prototypes": torch.optim.Adam([self.prototypes], lr=lr if o.lr_prototypes is None else o.lr_prototypes),
            "generator": torch.optim.Adam(self.generator.parameters(), lr=o.lr_generator, betas=betas),
            "discriminator": torch.optim.Adam(self.discriminator_parameters(), lr=o.lr_discriminator, betas=betas),
        }
        self._virtual: tuple[torch.Tensor, torch.Tensor] | None = None

    # ----------------------------------------------------------------------------------------------- pieces
    def discriminator_parameters(self) -> list[nn.Parameter]:
        return [*self.disc_trunk.parameters(), *self.disc_real.parameters(), *self.disc_class.parameters()]

    def features(self, output: HeadOutput) -> torch.Tensor:
        """f_t: the head's pooled vector (eq. 6.1's input), or the embedding for heads without an encoder."""
        return output.extras["pooled"] if self.pooled else output.embedding

    def encode(self, features: torch.Tensor) -> torch.Tensor:
        """E (eq. 6.1): the head's encoder (differentiable w.r.t. its weights), or l2 for the fallback."""
        if self.pooled:
            return self.head[0].encode(features)
        return F.normalize(features, dim=1) if self.normalized else features

    def noisy(self, prototypes: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        """The generator's input ``n(p + eps)`` (eq. 6.2)."""
        z = prototypes + eps
        return F.normalize(z, dim=1) if self.normalize_input else z

    def sample_noise(self, rows: int) -> torch.Tensor:
        """eps ~ N(0, Sigma), Sigma = (noise_std^2 / D) I, from the generator's own stream (CPU, then moved)."""
        eps = torch.randn(rows, self.embedding_dim, generator=self.noise, device="cpu") * (self.noise_std / math.sqrt(
            self.embedding_dim))
        return eps.to(self.prototypes.device)

    def decode(self, z: torch.Tensor, detach: bool = False) -> torch.Tensor:
        """G(z); with ``detach`` the weights are constants (gradients still flow to z)."""
        if not detach:
            return self.generator(z)
        params = {k: v.detach() for k, v in self.generator.named_parameters()}
        return functional_call(self.generator, params, (z,))

    def discriminate(self, embeddings: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(D_g logits (N,), D_c logits (N, N_t + N_v))."""
        hidden = self.disc_trunk(embeddings)
        return self.disc_real(hidden).squeeze(1), self.disc_class(hidden)

    def composition(self, batch_size: int) -> tuple[int, int]:
        """(#training-class rows, #virtual-class rows) for a real batch of ``batch_size``: |B~| = r|B|."""
        total = int(round(self.batch_ratio * batch_size))
        if self.mode == "none":
            return 0, 0
        if self.mode == "tcg" or self.num_virtual == 0:
            return (total, 0) if self.mode != "virtual" else (0, 0)
        if self.mode == "virtual":
            return 0, total
        virtual = int(round(self.virtual_fraction * total))
        return total - virtual, virtual

    # ----------------------------------------------------------------------------------------------- protocol
    def generate(self, output: HeadOutput, labels: torch.Tensor) -> GeneratedBatch | None:
        """x~_t and x~_v (eq. 6.2) with their labels (prototype rows: training t, virtual N_t + v)."""
        self._virtual = None
        n_t, n_v = self.composition(len(labels))
        # the rows are chosen on the CPU, from the CPU noise stream (the same draws on any device), then moved
        classes, counts = torch.unique(labels.cpu(), return_counts=True)
        rows = [classes.repeat(math.ceil(n_t / len(classes)))[:n_t]] if n_t else []
        chosen = torch.empty(0, dtype=torch.long, device="cpu")
        if n_v:
            per_class = self.virtual_per_class or int(counts.max())
            count = max(1, min(self.num_virtual, n_v // per_class))  # classes of >= per_class rows (positives)
            chosen = torch.randperm(self.num_virtual, generator=self.noise, device="cpu")[:count]
            rows.append(self.num_classes + chosen[torch.arange(n_v, device="cpu") * count // n_v])  # sizes differ <= 1
        if not rows:
            return None
        device = self.prototypes.device
        index = torch.cat(rows).to(device)
        eps = self.sample_noise(len(index))
        generated = self.encode(self.decode(self.noisy(self.prototypes[index], eps), detach=True))
        if n_v:
            self._virtual = (index[n_t:], eps[n_t:])
        if self.prototype_rows:
            proxy = torch.cat([classes, self.num_classes + chosen]).to(device)
            p = self.prototypes[proxy]
            generated = torch.cat([generated, F.normalize(p, dim=1) if self.normalized else p])
            index = torch.cat([index, proxy])
        return GeneratedBatch(generated, index.to(labels.device), examples=n_t + n_v)

    def _assign(self, params: list[nn.Parameter], grads: tuple[torch.Tensor | None, ...]) -> None:
        for p, g in zip(params, grads, strict=True):
            p.grad = None if g is None else g.detach()

    def discriminator_step(self, real: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
        """D minimises L_adv on the real embeddings and fresh (detached) virtual examples; G is not touched."""
        if self._virtual is None:
            return None
        rows, eps = self._virtual
        with torch.no_grad():
            fake = self.encode(self.decode(self.noisy(self.prototypes[rows], eps)))
        real_logit, real_class = self.discriminate(real)
        fake_logit, fake_class = self.discriminate(fake)
        loss = (F.binary_cross_entropy_with_logits(real_logit, torch.ones_like(real_logit))
                + F.binary_cross_entropy_with_logits(fake_logit, torch.zeros_like(fake_logit))
                + F.cross_entropy(real_class, labels) + F.cross_entropy(fake_class, rows))
        params = self.discriminator_parameters()
        self._assign(params, torch.autograd.grad(loss, params))
        self.optimizers["discriminator"].step()
        self.optimizers["discriminator"].zero_grad(set_to_none=True)
        return loss.detach()

    def generator_step(self, features: torch.Tensor, real: torch.Tensor) -> dict[str, torch.Tensor]:
        """G minimises w_rec L_rec (eq. 6.3) and maximises w_adv L_adv with D fixed; returns the terms. The
        virtual prototypes' adversarial gradients are added to their ``.grad`` (stepped in ``step``)."""
        rec = reconstruction_loss(features, self.generator(real))
        loss = self.reconstruction_weight * rec
        terms = {"mirage_rec": rec.detach()}
        params = list(self.generator.parameters())
        if self._virtual is not None:
            rows, eps = self._virtual
            fake = self.encode(self.generator(self.noisy(self.prototypes[rows], eps)))
            logit, classes = self.discriminate(fake)
            adv = (F.binary_cross_entropy_with_logits(logit, torch.zeros_like(logit))
                   + F.cross_entropy(classes, rows))
            if self.gan_loss == "minimax":
                loss = loss - self.adversarial_weight * adv
            else:
                own = torch.softmax(classes, dim=1).gather(1, rows[:, None]).squeeze(1)
                loss = loss + self.adversarial_weight * (
                    F.binary_cross_entropy_with_logits(logit, torch.ones_like(logit))
                    - torch.log1p(-own.clamp(max=1 - 1e-6)).mean())
            terms["mirage_adv_g"] = adv.detach()
            if self.adversarial_prototypes:
                params.append(self.prototypes)
        grads = torch.autograd.grad(loss, params)
        g_params = list(self.generator.parameters())
        self._assign(g_params, grads[:len(g_params)])
        self.optimizers["generator"].step()
        self.optimizers["generator"].zero_grad(set_to_none=True)
        if len(grads) > len(g_params):
            extra = grads[-1].detach()
            self.prototypes.grad = extra if self.prototypes.grad is None else self.prototypes.grad + extra
        return terms

    def step(self, output: HeadOutput, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        """D step, G step, then the prototypes' step (L_DML gradients from the trainer's backward, plus the
        adversarial ones)."""
        features = self.features(output).detach().float()
        real = output.embedding.detach().float()
        terms = {}
        disc = self.discriminator_step(real, labels)
        if disc is not None:
            terms["mirage_disc"] = disc
        terms.update(self.generator_step(features, real))
        if self.prototypes.grad is not None:
            self.optimizers["prototypes"].step()
            self.optimizers["prototypes"].zero_grad(set_to_none=True)
        self._virtual = None
        return terms

    # ----------------------------------------------------------------------------------------------- state
    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        from ..io.tensors import optimizer_to_flat, prefixed

        tensors = {**prefixed("module", self.state_dict()), "noise": self.noise.get_state()}
        meta: dict[str, Any] = {}
        for name, optimizer in self.optimizers.items():
            flat, optim_meta = optimizer_to_flat(optimizer)
            tensors.update(prefixed(f"optim.{name}", flat))
            meta[name] = optim_meta
        return tensors, {"optimizers": meta}

    def load_checkpoint_state(self, tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
        from ..io.tensors import optimizer_from_flat, unprefixed

        self.load_state_dict(unprefixed("module", tensors))
        self.noise.set_state(tensors["noise"])
        for name, optimizer in self.optimizers.items():
            optimizer_from_flat(optimizer, unprefixed(f"optim.{name}", tensors), state["optimizers"][name])

    # ----------------------------------------------------------------------------------------------- diagnostics
    def nearest_prototype_is_virtual(self) -> float:
        """Fraction of training-class prototypes whose nearest other prototype is virtual (§6.4.1: 80% on CUB).
        Cosine distance when embeddings are l2-normalised, Euclidean otherwise."""
        if self.num_virtual == 0:
            return 0.0
        with torch.no_grad():
            p = self.prototypes.detach().float().cpu()
            if self.normalized:
                p = F.normalize(p, dim=1)
            distance = torch.cdist(p, p)
            distance.fill_diagonal_(float("inf"))
            nearest = distance[: self.num_classes].argmin(dim=1)
        return float((nearest >= self.num_classes).float().mean())

    def write_diagnostics(self, folder: Path, embeddings: torch.Tensor, labels: np.ndarray,
                          names: list[str] | None = None) -> dict[str, Any]:
        from .diagnostics import latent_2d_picture, prototype_map

        folder = Path(folder)
        summary: dict[str, Any] = {"nearest_prototype_is_virtual": self.nearest_prototype_is_virtual(),
                                   "training_prototypes": self.num_classes, "virtual_prototypes": self.num_virtual}
        p = self.prototypes.detach().float().cpu()
        prototype_map(folder / "mirage-prototypes.png", F.normalize(p, dim=1) if self.normalized else p,
                      self.num_classes, self.projection, self.seed, summary["nearest_prototype_is_virtual"])
        summary["pictures"] = ["mirage-prototypes.png"]
        if self.embedding_dim == 2:
            with torch.no_grad():
                per_class = 20
                rows = torch.arange(self.num_classes + self.num_virtual).repeat_interleave(per_class)
                eps = torch.randn(len(rows), 2, generator=torch.Generator().manual_seed(self.seed)) * (
                    self.noise_std / math.sqrt(2))
                z = self.noisy(self.prototypes[rows.to(self.prototypes.device)], eps.to(self.prototypes.device))
                generated = self.encode(self.generator(z)).float().cpu()
            latent_2d_picture(folder / "mirage-latent2d.png", embeddings.float().cpu().numpy(), np.asarray(labels),
                              p.numpy(), self.num_classes, generated.numpy(), rows.numpy(), names)
            summary["pictures"].append("mirage-latent2d.png")
        return summary
