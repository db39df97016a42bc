"""HORDE (thesis ch. 5): Random Maclaurin moments, the cascade, pooling after the products, the regulariser."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from deepmetric import create_model
from deepmetric.config import build_config
from deepmetric.errors import ConfigError
from deepmetric.losses import BinomialDevianceLoss, ContrastiveLoss, HordeRegularizer, TripletLoss, build_objective
from deepmetric.models.high_order import HighOrderMoments, rademacher

X = torch.tensor([0.9, -0.4, 1.1, 0.3])
Y = torch.tensor([0.7, 0.5, 0.8, -0.6])  # <X, Y> = 1.1 (not close to 0 or 1, so the powers differ)


def rm_estimates(k: int, dim: int, seeds: range, scale: bool = False) -> torch.Tensor:
    """(1/d) <phi_k(X), phi_k(Y)> (or <phi_k(X), phi_k(Y)> with the 1/sqrt(d) factor) for each seed."""
    values = []
    for seed in seeds:
        moments = HighOrderMoments(4, orders=k, dim=dim, mode="rm_fixed", scale=scale, seed=seed)
        phi = moments.locations(torch.stack([X, Y]))[-1]
        values.append((phi[0] * phi[1]).sum() / (1 if scale else dim))
    return torch.stack(values).double()


def test_one_rademacher_draw_is_unbiased_exactly():
    """eq. 5.1-5.2: over all 2^(c k) sign patterns, the mean of phi_k(x) phi_k(y) is <x, y>^k exactly."""
    x, y = X[:3], Y[:3]
    for k in (2, 3):
        moments = HighOrderMoments(3, orders=k, dim=1, mode="cascaded")  # the cascade with ±1 matrices is RM
        total = 0.0
        patterns = list(itertools.product((-1.0, 1.0), repeat=3 * k))
        for signs in patterns:
            with torch.no_grad():
                moments.weight.copy_(torch.tensor(signs).view(3, k))
            phi = moments.locations(torch.stack([x, y]))[-1]
            total += phi[0, 0].item() * phi[1, 0].item()
        assert total / len(patterns) == pytest.approx(float(x @ y) ** k, rel=1e-5)


@pytest.mark.parametrize("k", [2, 3])
def test_random_maclaurin_is_unbiased_with_variance_falling_like_one_over_d(k):
    """eq. 5.5: (1/d) <phi_k(x), phi_k(y)> -> <x, y>^k; its variance over draws scales like 1/d (§5.5.4)."""
    target = float(X @ Y) ** k
    small, large = rm_estimates(k, 16, range(600)), rm_estimates(k, 64, range(600, 1200))
    for values in (small, large):
        standard_error = values.std() / math.sqrt(len(values))
        assert abs(values.mean() - target) < 4 * standard_error
    ratio = small.var() / large.var()
    assert 3.0 < ratio < 5.3  # 4 expected
    # Algorithm 1's 1/sqrt(d) factor: <phi_k(x), phi_k(y)> itself estimates <x, y>^k
    scaled = rm_estimates(k, 64, range(600, 1200), scale=True)
    assert torch.allclose(scaled, large, rtol=1e-5)


def test_cascade_equals_the_explicit_product_of_projections():
    """eq. 5.6 / Algorithm 1: phi_k = phi_{k-1} ⊙ W_k^T x is (W_1^T x) ⊙ ... ⊙ (W_k^T x)."""
    moments = HighOrderMoments(6, orders=5, dim=10, mode="cascaded")
    x = torch.randn(7, 6)
    w = moments.weight.view(6, 5, 10)
    for k, phi in enumerate(moments.locations(x), start=2):
        explicit = torch.ones(7, 10)
        for j in range(k):
            explicit = explicit * (x @ w[:, j])
        assert torch.allclose(phi, explicit, rtol=1e-5, atol=1e-6)
    assert moments.num_matrices == 5


def test_non_cascaded_orders_own_their_matrices():
    learned = HighOrderMoments(6, orders=4, dim=10, mode="learned")
    assert learned.num_matrices == 2 + 3 + 4
    x = torch.randn(3, 6)
    w = learned.weight.view(6, 9, 10)
    phi3 = learned.locations(x)[1]
    assert torch.allclose(phi3, (x @ w[:, 2]) * (x @ w[:, 3]) * (x @ w[:, 4]), rtol=1e-5, atol=1e-6)


def test_projection_is_the_one_by_one_convolution_at_every_location():
    moments = HighOrderMoments(5, orders=3, dim=4, mode="cascaded")
    feature_map = torch.randn(2, 5, 3, 4)
    x = feature_map.permute(0, 2, 3, 1).reshape(-1, 5)
    conv = F.conv2d(feature_map, moments.weight.t().reshape(-1, 5, 1, 1))  # (B, M d, h, w)
    as_rows = conv.permute(0, 2, 3, 1).reshape(-1, moments.num_matrices, 4)
    assert torch.allclose(moments.projections(x), as_rows, atol=1e-5)
    for b, i, j in [(0, 0, 0), (1, 2, 3)]:  # the per-location matrix product W_m^T x_ij
        local = feature_map[b, :, i, j] @ moments.weight
        assert torch.allclose(conv[b, :, i, j], local, atol=1e-5)


def test_moments_are_pooled_after_the_products():
    """eq. 5.8: m_k = mean_i phi_k(x_i) (for any memory layout), which is not phi_k(mean_i x_i)."""
    torch.manual_seed(1)
    moments = HighOrderMoments(5, orders=3, dim=8, mode="cascaded")
    feature_map = torch.rand(2, 5, 3, 3)
    pooled = moments(feature_map)
    pooled_nhwc = moments(feature_map.contiguous(memory_format=torch.channels_last))
    for b in range(2):
        local = [moments.locations(feature_map[b, :, i, j][None]) for i in range(3) for j in range(3)]
        for order in range(2):
            after = torch.stack([phis[order][0] for phis in local]).mean(0)
            before = moments.locations(feature_map[b].mean(dim=(1, 2))[None])[order][0]
            assert torch.allclose(pooled[order][b], after, rtol=1e-5, atol=1e-7)
            assert torch.allclose(pooled_nhwc[order][b], after, rtol=1e-5, atol=1e-7)
            assert (pooled[order][b] - before).abs().max() > 0.05 * after.abs().max()
    # permuting the locations changes nothing (GAP is symmetric)
    shuffled = feature_map.flatten(2)[:, :, torch.randperm(9)].view(2, 5, 3, 3)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(moments(shuffled), pooled, strict=True))


def test_parameter_counts_of_the_three_modes():
    """Thesis sizes c = 1024, d = 8192, K = 5: K matrices cascaded, 2+3+4+5 learned, none trained for rm_fixed."""
    with torch.device("meta"):
        cascaded = HighOrderMoments(1024, 5, 8192, "cascaded")
        learned = HighOrderMoments(1024, 5, 8192, "learned")
    assert sum(p.numel() for p in cascaded.parameters()) == 41_943_040
    assert sum(p.numel() for p in learned.parameters()) == 117_440_512
    fixed = HighOrderMoments(16, 5, 32, "rm_fixed")
    assert list(fixed.parameters()) == [] and fixed.state_dict() == {}
    assert torch.equal(HighOrderMoments(16, 5, 32, "rm_fixed", seed=3).weight, rademacher(16, 14 * 32, 3))
    with pytest.raises(ConfigError, match="mode must be one of"):
        HighOrderMoments(16, 5, 32, "cascade")
    with pytest.raises(ConfigError, match="orders must be at least 2"):
        HighOrderMoments(16, 1, 32)


def tiny_output(seed=0, embedding_dim=8):
    torch.manual_seed(seed)
    model = create_model("tiny", pretrained=False, embedding_dim=embedding_dim)
    images = torch.rand(8, 3, 32, 32)
    labels = torch.arange(4).repeat_interleave(2)
    return model, model(images), labels


def horde_objective(model, run_loss="binomial", run_options=None, **horde):
    config = build_config({"loss": {"name": run_loss, "options": run_options or {},
                                    "regularizers": {"horde": horde}}})
    return build_objective(config.loss, model.head, num_classes=4)


def test_regularizer_is_the_run_loss_on_every_order_with_unit_weights():
    """eq. 5.9: L_HORDE = sum_k L_DML(l2(E_k mean_i phi_k(x_i))), one copy of the run's loss per order."""
    model, output, labels = tiny_output()
    objective = horde_objective(model, "contrastive", {"margin": 0.3}, orders=4, dim=16)
    horde = objective.regularizers["horde"]
    assert [type(loss) for loss in horde.losses] == [ContrastiveLoss] * 3
    assert all(loss.margin == 0.3 for loss in horde.losses) and len({id(loss) for loss in horde.losses}) == 3
    pooled = horde.moments(output.extras["feature_map"])
    by_hand = sum(ContrastiveLoss(margin=0.3)(F.normalize(layer(m), dim=1), labels)
                  for layer, m in zip(horde.embed, pooled, strict=True))
    total, terms = objective(output, labels)
    assert terms["horde"].item() == pytest.approx(by_hand.item(), rel=1e-5)
    assert total.item() == pytest.approx((terms["metric"] + terms["horde"]).item(), rel=1e-6)
    mean = horde_objective(model, "contrastive", {"margin": 0.3}, orders=4, dim=16, reduction="mean")
    mean.load_state_dict(objective.state_dict())
    assert mean(output, labels)[1]["horde"].item() == pytest.approx(by_hand.item() / 3, rel=1e-5)
    other = horde_objective(model, orders=3, dim=16, loss="triplet", loss_options={"margin": 0.2})
    assert [type(loss) for loss in other.regularizers["horde"].losses] == [TripletLoss] * 2
    assert type(other.metric_losses[0]) is BinomialDevianceLoss


def test_regularizer_without_per_order_embeddings_and_option_errors():
    """Table 5.3: fixed RM, no embedding layer: the loss acts on the l2-normalised d-dimensional moments."""
    model, output, labels = tiny_output()
    objective = horde_objective(model, orders=3, dim=24, mode="rm_fixed", embedding_dim=0)
    embeddings = objective.auxiliary_embeddings(output)
    assert list(embeddings) == ["horde.order2", "horde.order3"]
    assert all(e.shape == (8, 24) and torch.allclose(e.norm(dim=1), torch.ones(8)) for e in embeddings.values())
    assert [p for p in objective.parameters()] == []
    with pytest.raises(ConfigError, match="no option 'order'.*did you mean 'orders'"):
        horde_objective(model, order=3)
    with pytest.raises(ConfigError, match="loss_options needs loss"):
        horde_objective(model, loss_options={"margin": 0.1})


def test_the_one_over_sqrt_d_factor_changes_neither_loss_nor_gradients():
    """The factor is a positive constant in front of each order's pooled moments, which the linear embedding and the
    l2 normalisation cancel: the loss and the gradients (the objective's and the backbone's, through the feature map)
    are the same with and without it."""
    model, output, labels = tiny_output()
    # float64, so that only the property can tell the two apart. 1/sqrt(32) is not a power of two, so the scaled
    # moments round differently; in float32 the gradients then differ by ~2e-7 of their norm (a few ulps), which
    # where oneDNN sums in another order (no AVX-512) is 2e-3 of an entry near zero (9.18e-5 against 9.17e-5 in a
    # gradient of norm 131): no elementwise rtol holds. In float64 they differ by ~6e-16 of their norm; 1e-10 of the
    # norm leaves a margin of 1e5 for other summation orders, and a factor that is not one positive constant per
    # order still fails: off by 1e-9 on some coordinates it moves the gradients by 5e-10 of their norm, an offset
    # or a detached path by more than half of it.
    feature_map = output.extras["feature_map"].detach().double().requires_grad_()
    output = replace(output, extras={**output.extras, "feature_map": feature_map})
    plain = horde_objective(model, orders=4, dim=32).double()
    scaled = horde_objective(model, orders=4, dim=32, scale=True).double()
    scaled.load_state_dict(plain.state_dict())
    values = []
    for objective in (plain, scaled):
        objective.zero_grad()
        feature_map.grad = None
        loss = objective.regularizers["horde"](output, labels)
        loss.backward()
        values.append((loss.item(), [p.grad.clone() for p in objective.parameters()] + [feature_map.grad.clone()]))
    (loss_plain, grads_plain), (loss_scaled, grads_scaled) = values
    assert loss_scaled == pytest.approx(loss_plain, rel=1e-10)
    assert len(grads_plain) == 5  # the moments' matrices, the three embeddings and the feature map
    for a, b in zip(grads_plain, grads_scaled, strict=True):
        assert (a - b).norm() <= 1e-10 * a.norm()


@pytest.mark.parametrize("mode", ["cascaded", "learned"])
def test_every_horde_parameter_gets_a_gradient(mode):
    model, output, labels = tiny_output()
    objective = horde_objective(model, orders=3, dim=16, mode=mode)
    total, _ = objective(output, labels)
    total.backward()
    named = dict(objective.named_parameters())
    assert set(named) == {"regularizers.horde.moments.weight", "regularizers.horde.embed.0.weight",
                          "regularizers.horde.embed.1.weight"}
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in named.values())


def test_a_head_without_a_feature_map_is_refused():
    model, _, _ = tiny_output()
    model.head.feature_channels = None
    with pytest.raises(ConfigError, match="needs a head that exposes its local feature map"):
        horde_objective(model)


def test_horde_leaves_the_first_order_embedding_bit_identical():
    """eq. 5.10: computing the regulariser does not touch the embedding the head returns."""
    model, output, labels = tiny_output()
    model.eval()
    images = torch.rand(8, 3, 32, 32)
    output = model(images)
    before = output.embedding.clone()
    objective = horde_objective(model, orders=3, dim=16)
    objective(output, labels)
    head = model.head
    by_hand = F.normalize(head.embed(head.tail(model.trunk(model.normalize(images))).mean(dim=(2, 3))), dim=1)
    assert torch.equal(output.embedding, before) and torch.equal(before, model(images).embedding)
    assert torch.equal(before, by_hand)
    assert isinstance(objective.regularizers["horde"], HordeRegularizer)


def test_cli_trains_with_horde_and_evaluates_every_order(tmp_path, capsys, monkeypatch):
    """--regularizer horde through the CLI; the checkpointed model is the plain GAP model (HORDE discarded);
    its test-time embedding is bit-identical with and without the objective attached; per-order + PCA rows
    (whose PCA is fit on the training split: the only evaluation that audits that split's images)."""
    import json

    import numpy as np

    from deepmetric.cli import main
    from deepmetric.evaluation import EmbedSettings, embed_table
    from deepmetric.evaluation.auxiliary import embed_with_objective
    from deepmetric.io.tensors import unprefixed
    from deepmetric.runs.checkpoint import load_checkpoint
    from deepmetric.runs.folder import RunDir
    from deepmetric.runs.model import load_run_model
    from deepmetric.runs.table import load_table
    from test_cli import TINY

    out = tmp_path / "run"
    argv = ["train", *TINY, "--out", str(out), "--no-test", "--regularizer", "horde",
            "loss.regularizers.horde.dim=32", "loss.regularizers.horde.orders=3"]
    assert main(argv) == 0
    run = RunDir(out)
    assert run.config().loss.regularizers == {"horde": {"dim": 32, "orders": 3}}
    assert all("horde" in record for record in run.read_log() if "loss" in record)
    tensors, _ = load_checkpoint(run.last)
    plain = create_model("tiny", pretrained=False, embedding_dim=16)
    assert set(unprefixed("model", tensors)) == set(plain.state_dict())
    assert any(key.startswith("objective.regularizers.horde.") for key in tensors)

    model, config, _ = load_run_model(out, "last")
    table = load_table(config)[0].split("test").subset(np.arange(20))
    objective = build_objective(config.loss, model.head, num_classes=5)
    objective.load_state_dict(unprefixed("objective", tensors))
    alone = embed_table(model, table, EmbedSettings(16, progress=False))
    attached = embed_with_objective(model, objective, table, EmbedSettings(16, progress=False))
    assert np.array_equal(alone, attached["embedding"])
    assert list(attached) == ["embedding", "horde.order2", "horde.order3"]

    from helpers import record_audited_splits

    audited = record_audited_splits(monkeypatch)
    capsys.readouterr()
    assert main(["evaluate", str(out), "--all-embeddings", "--pca-dim", "8", "--json", "--quiet"]) == 0
    assert audited == [{"test"}, {"train"}]
    rows = json.loads(capsys.readouterr().out)
    assert list(rows) == ["embedding", "horde.order2", "horde.order3", "concatenation, PCA 8 (fit on train)"]
    assert all(0 <= row["recall@1"] <= 1 for row in rows.values())
    assert (out / "metrics-all-embeddings.json").is_file()


def test_regularizer_flag_adds_defaults_and_keeps_configured_options(monkeypatch):
    from deepmetric.models.heads.gap import GAPHead
    from deepmetric.workflows import add_regularizers

    config = build_config({"loss": {"regularizers": {"horde": {"dim": 64}}}})
    add_regularizers(config, ["horde"])
    assert config.loss.regularizers == {"horde": {"dim": 64}}
    monkeypatch.setattr(GAPHead, "default_regularizers", {"other": {"weight": 0.5}})
    config = build_config({})
    add_regularizers(config, ["horde"])
    assert config.loss.regularizers == {"other": {"weight": 0.5}, "horde": {}}
    with pytest.raises(ConfigError, match="unknown regularizer 'hord'.*did you mean 'horde'"):
        add_regularizers(build_config({}), ["hord"])


def test_abe_branch_feature_map_is_the_learners_tail_maps_concatenated():
    """ABE + HORDE (thesis §5.5.3): extras['feature_map'] holds the M learners' maps psi(A_m ⊙ F) side by side
    on channels; each learner's slice, pooled and embedded, gives that learner's part. Chunking psi changes
    nothing. Without the option the head keeps F there and HORDE refuses it."""
    torch.manual_seed(0)
    images = torch.rand(3, 3, 32, 32)
    model = create_model("tiny", head="abe", pretrained=False, embedding_dim=16, num_learners=4,
                         branch_feature_map=True, tail_chunk=5).eval()
    head = model.head
    output = model(images)
    maps = output.extras["feature_map"]
    channels = head.feature_channels // 4
    assert head.feature_channels == maps.shape[1] and maps.shape[0] == 3
    pooled = maps.unflatten(1, (4, channels)).mean(dim=(3, 4))  # (B, M, C')
    for part, by_hand in zip(output.parts, head.embed(pooled), strict=True):
        assert torch.allclose(part, by_hand, atol=1e-6)
    head.tail_chunk = None
    assert torch.allclose(model(images).extras["feature_map"], maps, atol=1e-6)
    plain = create_model("tiny", head="abe", pretrained=False, embedding_dim=16, num_learners=4)
    assert plain.head.feature_channels is None
    with pytest.raises(ConfigError, match="needs a head that exposes its local feature map"):
        horde_objective(plain)


def test_abe_horde_reduces_the_learner_maps_by_a_1x1_convolution_and_trains_the_head_through_it():
    torch.manual_seed(0)
    model = create_model("tiny", head="abe", pretrained=False, embedding_dim=16, num_learners=4,
                         branch_feature_map=True)
    output, labels = model(torch.rand(8, 3, 32, 32)), torch.arange(4).repeat_interleave(2)
    objective = horde_objective(model, "contrastive", orders=3, dim=16, reduce_channels=6, reduction="mean")
    horde = objective.regularizers["horde"]
    assert horde.reduce.weight.shape == (6, model.head.feature_channels, 1, 1) and horde.reduce.bias is None
    reduced = torch.einsum("oc,bchw->bohw", horde.reduce.weight[:, :, 0, 0], output.extras["feature_map"])
    by_hand = sum(ContrastiveLoss()(F.normalize(layer(m), dim=1), labels)
                  for layer, m in zip(horde.embed, horde.moments(reduced), strict=True)) / 2
    _, terms = objective(output, labels)
    assert terms["horde"].item() == pytest.approx(by_hand.item(), rel=1e-5)
    terms["horde"].backward()
    assert horde.reduce.weight.grad.abs().sum() > 0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.head.psi.parameters())
    with pytest.raises(ConfigError, match="reduce_channels must be at least 1"):
        horde_objective(model, reduce_channels=0)


@pytest.mark.parametrize(("rate", "groups", "expected"), [
    ("backbone", {}, 1e-5), ("head", {}, 1e-3), ("backbone", {"horde": {"lr_scale": 10}}, 1e-4)])
def test_hordes_weights_train_in_a_group_of_their_own_at_the_backbones_rate_by_default(rate, groups, expected):
    """The thesis and its code train everything at one Adam rate: HORDE's weights are the ``horde`` group at
    ``train.lr_backbone`` unless ``rate: head`` (``train.lr``); a learned parameter of the per-order losses
    (margin's beta) stays in ``loss``."""
    from deepmetric.training.optim import build_optimizer

    model, _, _ = tiny_output()
    objective = horde_objective(model, "margin", orders=3, dim=16, rate=rate)
    horde = objective.regularizers["horde"]
    config = build_config({"train": {"lr": 1e-3, "lr_backbone": 1e-5, "lr_loss": 5e-2, "groups": groups}})
    optimizer = build_optimizer(model, objective, config.train)
    by_name = {group["name"]: group for group in optimizer.param_groups}
    assert by_name["horde"]["lr"] == pytest.approx(expected)
    assert {id(p) for p in by_name["horde"]["params"]} == {id(p) for p in horde.group_parameters()}
    assert len(horde.group_parameters()) == 1 + 2  # the moments' matrices and the two per-order embeddings
    betas = {id(p) for loss in horde.losses for p in loss.parameters()}
    assert betas and betas <= {id(p) for p in by_name["loss"]["params"]}
    everything = [p for group in optimizer.param_groups for p in group["params"]]
    assert len(everything) == len({id(p) for p in everything})  # no parameter in two groups
    with pytest.raises(ConfigError, match="rate must be one of backbone, head, got 'fast'"):
        horde_objective(model, orders=3, dim=16, rate="fast")


def test_hordes_per_order_embeddings_start_glorot_uniform_as_the_authors_keras_dense():
    """U(+-sqrt(6 / (d + D))) with d = 1024, D = 8: the largest entry is just under the bound, and the spread is the
    uniform's (bound / sqrt 3); ``init: torch`` keeps nn.Linear's U(+-1 / sqrt(d)), sqrt(6 d / (d + D)) ~ 2.4
    times narrower."""
    model, _, _ = tiny_output()
    glorot = horde_objective(model, orders=3, dim=1024).regularizers["horde"].embed
    plain = horde_objective(model, orders=3, dim=1024, init="torch").regularizers["horde"].embed
    bound = math.sqrt(6 / (1024 + 8))
    for weight in (layer.weight.detach() for layer in glorot):
        assert 0.99 * bound < float(weight.abs().max()) <= bound
        assert float(weight.std()) == pytest.approx(bound / math.sqrt(3), rel=0.05)
    for weight in (layer.weight.detach() for layer in plain):
        assert float(weight.abs().max()) <= 1 / math.sqrt(1024)
    with pytest.raises(ConfigError, match="init must be 'glorot' or 'torch', got 'he'"):
        horde_objective(model, orders=3, dim=16, init="he")
