"""Each loss against a slow explicit loop over pairs/triplets, and pytorch-metric-learning where it coincides."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from deepmetric.errors import ConfigError
from deepmetric.losses import (
    BinomialDevianceLoss,
    ContrastiveLoss,
    EuclideanContrastiveLoss,
    MarginLoss,
    MultiSimilarityLoss,
    TripletLoss,
    build_loss,
)


def batch(n_classes=4, per_class=3, dim=8, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = F.normalize(torch.randn(n_classes * per_class, dim, generator=g, dtype=dtype), dim=1)
    y = torch.arange(n_classes).repeat_interleave(per_class)
    return x, y


def pairs(x, y):
    n = len(y)
    for i in range(n):
        for j in range(n):
            if i != j:
                yield i, j, float(x[i] @ x[j]), bool(y[i] == y[j])


def mean(values):
    return sum(values) / len(values) if values else 0.0


def slow_contrastive(x, y, margin=0.5):
    pos = [(1 - s) ** 2 for _, _, s, same in pairs(x, y) if same]
    neg = [s - margin for _, _, s, same in pairs(x, y) if not same and s - margin > 0]
    return 0.5 * mean(pos) + 0.5 * mean(neg)


def slow_triplet(x, y, margin=0.1):
    losses = []
    n = len(y)
    for q in range(n):
        for p in range(n):
            if p == q or y[p] != y[q]:
                continue
            for m in range(n):
                if y[m] == y[q]:
                    continue
                value = float(x[q] @ x[m] - x[q] @ x[p] + margin)
                if value > 0:
                    losses.append(value)
    return mean(losses)


def slow_binomial(x, y, alpha=2.0, beta=0.5, c=25.0, cost="exponent", c_pos=1.0):
    per_anchor = []
    n = len(y)
    for i in range(n):
        pos, neg = [], []
        for j in range(n):
            if i == j:
                continue
            s = float(x[i] @ x[j])
            if y[i] == y[j] and cost == "exponent":
                pos.append(math.log1p(math.exp(-alpha * c_pos * (s - beta))))
            elif y[i] == y[j]:
                pos.append(c_pos * math.log1p(math.exp(-alpha * (s - beta))))
            elif cost == "exponent":
                neg.append(math.log1p(math.exp(alpha * c * (s - beta))))
            else:
                neg.append(c * math.log1p(math.exp(alpha * (s - beta))))
        per_anchor.append(mean(pos) + mean(neg))
    return mean(per_anchor)


def slow_multi_similarity(x, y, alpha=2.0, beta=50.0, base=0.5, mining=False, eps=0.1):
    total = []
    n = len(y)
    for i in range(n):
        pos = [float(x[i] @ x[j]) for j in range(n) if j != i and y[j] == y[i]]
        neg = [float(x[i] @ x[j]) for j in range(n) if y[j] != y[i]]
        if mining:
            min_pos = min(pos) if pos else math.inf
            max_neg = max(neg) if neg else -math.inf
            neg, pos = [s for s in neg if s + eps > min_pos], [s for s in pos if s - eps < max_neg]
        p = math.log1p(sum(math.exp(-alpha * (s - base)) for s in pos)) / alpha
        q = math.log1p(sum(math.exp(beta * (s - base)) for s in neg)) / beta
        total.append(p + q)
    return mean(total)


def slow_margin(x, y, margin=0.2, beta=1.2):
    """Wu et al.'s margin loss (thesis eq. 2.11's distance), pair by pair; ``beta`` is one boundary or a list of
    one per class, the anchor's (row i's) class choosing it."""
    active, total = 0, 0.0
    for i, _, s, same in pairs(x, y):
        b = beta[int(y[i])] if isinstance(beta, list) else beta
        d = math.sqrt(max(2 - 2 * s, 1e-12))
        value = max(0.0, margin + d - b) if same else max(0.0, margin + b - d)
        total += value
        active += value > 0
    return total / max(active, 1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_losses_match_slow_loops(seed):
    x, y = batch(seed=seed)
    assert float(ContrastiveLoss()(x, y)) == pytest.approx(slow_contrastive(x, y), abs=1e-10)
    assert float(TripletLoss()(x, y)) == pytest.approx(slow_triplet(x, y), abs=1e-10)
    assert float(BinomialDevianceLoss()(x, y)) == pytest.approx(slow_binomial(x, y), abs=1e-10)
    assert float(BinomialDevianceLoss(cost="weight")(x, y)) == pytest.approx(
        slow_binomial(x, y, cost="weight"), abs=1e-10)
    table_1 = BinomialDevianceLoss(positive_weight=25.0, negative_weight=1.0)  # DGML Table 1's placement
    # torch's softplus is linear above 20, where log(1 + e^x) - x < e^-20 = 2e-9
    assert float(table_1(x, y)) == pytest.approx(slow_binomial(x, y, c=1.0, c_pos=25.0), abs=1e-8)
    assert float(BinomialDevianceLoss(positive_weight=3.0, cost="weight")(x, y)) == pytest.approx(
        slow_binomial(x, y, cost="weight", c_pos=3.0), abs=1e-10)
    assert float(MultiSimilarityLoss(mining=False)(x, y)) == pytest.approx(slow_multi_similarity(x, y), abs=1e-10)
    assert float(MultiSimilarityLoss(mining=True)(x, y)) == pytest.approx(
        slow_multi_similarity(x, y, mining=True), abs=1e-10)
    margin = MarginLoss().double()
    beta = float(margin.beta.detach())  # 1.2 as stored in float32
    assert float(margin(x, y).detach()) == pytest.approx(slow_margin(x, y, beta=beta), abs=1e-10)


def test_triplet_matches_pytorch_metric_learning():
    from pytorch_metric_learning import distances, losses

    x, y = batch(n_classes=5, per_class=4, dim=16, seed=3, dtype=torch.float32)
    reference = losses.TripletMarginLoss(margin=0.1, distance=distances.CosineSimilarity(),
                                         triplets_per_anchor="all")
    assert float(TripletLoss(0.1)(x, y)) == pytest.approx(float(reference(x, y)), abs=1e-6)


def test_multi_similarity_matches_pytorch_metric_learning_with_and_without_mining():
    from pytorch_metric_learning import losses, miners

    x, y = batch(n_classes=5, per_class=4, dim=16, seed=4, dtype=torch.float32)
    reference = losses.MultiSimilarityLoss(alpha=2, beta=50, base=0.5)
    assert float(MultiSimilarityLoss(mining=False)(x, y)) == pytest.approx(float(reference(x, y)), abs=1e-5)
    mined = miners.MultiSimilarityMiner(epsilon=0.1)(x, y)
    assert float(MultiSimilarityLoss(mining=True)(x, y)) == pytest.approx(float(reference(x, y, mined)), abs=1e-5)


def test_contrastive_negative_term_matches_pytorch_metric_learning():
    # With no positive pair in the batch both reduce to the mean of the active negative hinges
    # (ours halves it, as the authors' code does; PML's positive term uses 1 - s, ours (1 - s)^2).
    from pytorch_metric_learning import distances, losses

    x, y = batch(n_classes=12, per_class=1, dim=4, seed=5, dtype=torch.float32)
    reference = losses.ContrastiveLoss(pos_margin=1, neg_margin=0.5, distance=distances.CosineSimilarity())
    assert 2 * float(ContrastiveLoss(0.5)(x, y)) == pytest.approx(float(reference(x, y)), abs=1e-6)


@pytest.mark.parametrize("name", ["contrastive", "triplet", "binomial", "multi-similarity", "margin"])
def test_losses_are_finite_and_give_gradients(name):
    x, y = batch(dtype=torch.float32)
    x = x.clone().requires_grad_(True)
    loss = build_loss(name, num_classes=4)(x, y)
    loss.backward()
    assert torch.isfinite(loss) and x.grad is not None and torch.isfinite(x.grad).all()
    assert x.grad.abs().sum() > 0


def test_perfect_embeddings_give_zero_hinge_losses():
    y = torch.arange(4).repeat_interleave(3)
    x = F.one_hot(y, 8).double()  # same class identical, different classes orthogonal (s = 0)
    assert float(ContrastiveLoss()(x, y)) == 0.0
    assert float(TripletLoss()(x, y)) == 0.0
    assert float(MarginLoss(beta=1.2).double()(x, y).detach()) == 0.0  # d_pos = 0 < 1.0, d_neg = sqrt(2) > 1.4


def test_margin_per_class_boundaries_match_a_slow_loop_with_the_anchors_class():
    """``per_class=True``: each pair's boundary is beta of its anchor's class (Wu et al. 2017, eq. 4's beta^(class)),
    and ``nu`` adds nu times the mean of the boundaries used. Distinct betas, labels 1..4 of 5 classes in a
    shuffled order, so neither class 0's boundary nor one shared boundary can give the slow loop's value."""
    x, y = batch(n_classes=4, per_class=3, seed=6)
    y = (y + 1)[torch.randperm(len(y), generator=torch.Generator().manual_seed(0))]
    betas = [0.6, 0.9, 1.1, 1.3, 1.5]
    loss = MarginLoss(per_class=True, num_classes=5).double()
    with torch.no_grad():
        loss.beta.copy_(torch.tensor(betas, dtype=torch.float64))
    expected = slow_margin(x, y, beta=betas)
    assert float(loss(x, y).detach()) == pytest.approx(expected, abs=1e-10)
    for shared in (betas[0], sum(betas) / 5):  # what a loss ignoring the classes would give
        assert abs(slow_margin(x, y, beta=shared) - expected) > 1e-3
    loss.nu = 0.1
    used = sum(betas[int(c)] for c in y) / len(y)
    assert float(loss(x, y).detach()) == pytest.approx(expected + 0.1 * used, abs=1e-10)


def test_margin_per_class_beta_receives_gradient_only_for_present_classes():
    x, y = batch(n_classes=3, per_class=3, dtype=torch.float32)
    loss = MarginLoss(per_class=True, num_classes=5)
    loss(x, y).backward()
    assert loss.beta.grad[:3].abs().sum() > 0 and float(loss.beta.grad[3:].abs().sum()) == 0.0


def test_unknown_loss_and_option_are_named():
    with pytest.raises(ConfigError, match="did you mean 'triplet'"):
        build_loss("tripplet")
    with pytest.raises(ConfigError, match="no option 'marginn'.*did you mean 'margin'"):
        build_loss("contrastive", {"marginn": 0.3})


@pytest.mark.parametrize("squared_hinge", [False, True])
def test_euclidean_contrastive_off_the_sphere_matches_a_slow_loop(squared_hinge):
    """``contrastive-euclidean`` with ``unit=False`` (thesis eq. 2.9 on raw vectors, as the MNIST 2-D picture of
    §6.4.1 trains): positives d^2, negatives max(0, m - d) (squared with ``squared_hinge``), d the Euclidean
    distance of the unnormalised rows, averaged over all pairs."""
    g = torch.Generator().manual_seed(7)
    x, y = 0.7 * torch.randn(9, 3, generator=g, dtype=torch.float64), torch.arange(3).repeat_interleave(3)
    values = []
    for i in range(9):
        for j in range(9):
            if i != j:
                d = float((x[i] - x[j]).norm())
                hinge = max(0.0, 1.0 - d) ** (2 if squared_hinge else 1)
                values.append(d * d if y[i] == y[j] else hinge)
    loss = EuclideanContrastiveLoss(margin=1.0, squared_hinge=squared_hinge, unit=False)
    assert float(loss(x, y)) == pytest.approx(sum(values) / len(values), abs=1e-10)


def test_losses_match_slow_loops_on_classes_of_unequal_sizes():
    """The per-anchor means (binomial deviance, multi-similarity) and the pair counts of the others differ from a
    mean over all pairs when classes have different sizes (a P x K batch hides this): 5 / 3 / 2 / 1 images."""
    g = torch.Generator().manual_seed(11)
    x = F.normalize(torch.randn(11, 8, generator=g, dtype=torch.float64), dim=1)
    y = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 3])
    assert float(BinomialDevianceLoss()(x, y)) == pytest.approx(slow_binomial(x, y), abs=1e-10)
    assert float(BinomialDevianceLoss(cost="weight")(x, y)) == pytest.approx(slow_binomial(x, y, cost="weight"),
                                                                            abs=1e-10)
    assert float(MultiSimilarityLoss(mining=False)(x, y)) == pytest.approx(slow_multi_similarity(x, y), abs=1e-10)
    assert float(ContrastiveLoss()(x, y)) == pytest.approx(slow_contrastive(x, y), abs=1e-10)
    assert float(TripletLoss()(x, y)) == pytest.approx(slow_triplet(x, y), abs=1e-10)
    margin = MarginLoss().double()
    assert float(margin(x, y).detach()) == pytest.approx(slow_margin(x, y, beta=float(margin.beta.detach())), abs=1e-10)
