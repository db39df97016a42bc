"""DGML: the A-grouping head (eqs. 5-9, Theorem 1), the grouping baselines and the diversity loss (eq. 4)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from deepmetric import create_model
from deepmetric.config import build_config
from deepmetric.errors import ConfigError
from deepmetric.losses import DiversityLoss, build_objective
from deepmetric.models.heads import HEADS, HeadOutput
from deepmetric.models.heads.dgml import AGroupingHead
from deepmetric.models.heads.grouping_baselines import CGroupingHead, GGroupingHead, MGroupingHead, NGroupingHead
from deepmetric.training.optim import build_optimizer
from helpers import tiny_config

GROUPING_HEADS = ["dgml", "n-grouping", "m-grouping", "g-grouping", "c-grouping"]


def small_head(name: str, **options) -> torch.nn.Module:
    """A grouping head on a 16-channel map with 4 groups of 3 (n-grouping: one of 12), in float64."""
    options = {"groups": 4, **options} if name != "n-grouping" else options
    if name == "dgml":
        options.setdefault("key_dim", 6)
    return HEADS[name](in_channels=16, embedding_dim=12, **options).double()


def feature_map(batch=2, channels=16, height=3, width=5, seed=0) -> torch.Tensor:
    return torch.randn(batch, channels, height, width, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)


@pytest.mark.parametrize("name", GROUPING_HEADS)
def test_output_is_invariant_to_permuting_spatial_positions(name):
    """Theorem 1 (eq. 13): any bijection on the H x W positions of J leaves every group unchanged."""
    head = small_head(name).eval()
    features = feature_map()
    reference = head(features)
    for seed in range(3):
        permutation = torch.randperm(15, generator=torch.Generator().manual_seed(seed))
        permuted = features.flatten(2)[:, :, permutation].view_as(features)
        output = head(permuted)
        assert torch.allclose(output.embedding, reference.embedding, atol=1e-12)
        assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(output.parts, reference.parts, strict=True))
        if reference.attention is not None:  # the maps move with the positions
            assert torch.allclose(output.attention.flatten(2), reference.attention.flatten(2)[:, :, permutation],
                                  atol=1e-12)
    shifted = head(torch.roll(features, shifts=(1, 3), dims=(2, 3)))  # a circular shift is a permutation
    assert torch.allclose(shifted.embedding, reference.embedding, atol=1e-12)


def test_attention_rows_are_distributions_and_groups_are_unit_vectors():
    head = small_head("dgml")
    with torch.no_grad():
        head.queries.mul_(50)  # peaked attention as well as flat
    output = head(feature_map(batch=3))
    assert output.attention.shape == (3, 4, 3, 5)
    assert (output.attention >= 0).all()
    assert torch.allclose(output.attention.sum(dim=(2, 3)), torch.ones(3, 4, dtype=torch.float64), atol=1e-12)
    assert output.attention.amax() > 0.5  # not uniform: the check above is not trivially met
    assert len(output.parts) == 4 and all(p.shape == (3, 3) for p in output.parts)
    assert all(torch.allclose(p.norm(dim=1), torch.ones(3, dtype=torch.float64)) for p in output.parts)
    concatenated = torch.cat(output.parts, dim=1) / 2  # four unit groups: norm sqrt(4)
    assert torch.allclose(output.embedding, concatenated, atol=1e-12)


def test_zero_queries_reduce_to_a_linear_map_of_global_average_pooling():
    head = small_head("dgml")
    with torch.no_grad():
        head.queries.zero_()
    features = feature_map()
    output = head(features)
    assert torch.allclose(output.attention, torch.full_like(output.attention, 1 / 15), atol=1e-15)
    value_matrix = head.value.weight[:, :, 0, 0]  # (D_V, C)
    expected = F.normalize(features.mean(dim=(2, 3)) @ value_matrix.t(), dim=1)
    assert all(torch.allclose(part, expected, atol=1e-12) for part in output.parts)


def test_group_embedding_is_the_attention_weighted_sum_of_values():
    """Eq. 8 written out for one image and one group."""
    head = small_head("dgml")
    features = feature_map(batch=1)
    output = head(features)
    keys = torch.einsum("kc,chw->khw", head.key.weight[:, :, 0, 0], features[0]).flatten(1)
    values = torch.einsum("vc,chw->vhw", head.value.weight[:, :, 0, 0], features[0]).flatten(1)
    for group in range(4):
        weights = torch.softmax(head.queries[group] @ keys, dim=0)  # eq. 7, no scaling
        f = sum(weights[n] * values[:, n] for n in range(15))
        assert torch.allclose(output.parts[group][0], F.normalize(f, dim=0), atol=1e-12)


def test_a_grouping_parameter_count_on_resnet50():
    """C = 2048, D_K = C/8 = 256, P = 4 x 128: key 2048 x 256, value 2048 x 128, queries 4 x 256."""
    model = create_model("resnet50", head="dgml", pretrained=False, embedding_dim=512)
    head = model.head
    assert (head.in_channels, head.key_dim, head.groups, head.group_dim) == (2048, 256, 4, 128)
    assert sum(p.numel() for p in head.parameters()) == 2048 * 256 + 2048 * 128 + 4 * 256 == 787_456
    three = AGroupingHead(in_channels=2048, embedding_dim=512, groups=3)  # the 3 x 170 preset: 510 dimensions
    assert three.embedding_dim == 510
    assert sum(p.numel() for p in three.parameters()) == 2048 * 256 + 2048 * 170 + 3 * 256
    projected = AGroupingHead(in_channels=2048, embedding_dim=512, groups=4, projection=True)
    assert sum(p.numel() for p in projected.parameters()) == 787_456 + 128 * 128


@pytest.mark.parametrize(("cls", "expected"), [
    (NGroupingHead, 2048 * 512),
    (MGroupingHead, 2048 * 4 * 128),
    (GGroupingHead, (2048 * 256 + 256) + 4 * (256 * 2048 + 2048) + 2048 * 128),
    (CGroupingHead, 4 * (2048 * 409 + 409 * 2048) + (2048 * 128 + 128)),
])
def test_grouping_baseline_parameter_counts_on_resnet50(cls, expected):
    head = cls(in_channels=2048, embedding_dim=512) if cls is NGroupingHead else cls(2048, 512, groups=4)
    assert sum(p.numel() for p in head.parameters()) == expected


@pytest.mark.parametrize("name", GROUPING_HEADS)
def test_every_new_parameter_gets_a_gradient_in_one_training_step(name):
    options = {"projection": True} if name == "dgml" else {}
    config = tiny_config(model={"head": name, "head_options": options},
                         loss={"name": "margin", "options": {"per_class": True}},
                         train={"lr": 1e-2, "lr_loss": 1e-2})
    torch.manual_seed(0)
    model = create_model("tiny", head=name, pretrained=False, embedding_dim=16, freeze_bn=False, **options)
    objective = build_objective(config.loss, model.head, num_classes=3)
    optimizer = build_optimizer(model, objective, config.train)
    before = {n: p.detach().clone() for n, p in [*model.head.named_parameters(), *objective.named_parameters()]}
    images, labels = torch.rand(12, 3, 32, 32), torch.arange(3).repeat_interleave(4)
    loss, terms = objective(model(images), labels)
    optimizer.zero_grad()
    loss.backward()
    for label, parameter in [*model.head.named_parameters(), *objective.named_parameters()]:
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, label
    optimizer.step()
    changed = [n for n, p in [*model.head.named_parameters(), *objective.named_parameters()]
               if not torch.equal(p.detach(), before[n])]
    assert len(changed) == len(before)
    assert set(terms) == ({"metric"} if name == "n-grouping" else {"metric", "diversity"})


def test_head_defaults_give_the_papers_objective_and_parameter_groups():
    model = create_model("tiny", head="dgml", pretrained=False, embedding_dim=16, freeze_bn=False)
    objective = build_objective(build_config({"loss": {"name": "margin", "options": {"per_class": True}}}).loss,
                                model.head, num_classes=5)
    assert (objective.on, objective.parts_reduction, objective.weights) == ("parts", "mean", {"diversity": 0.01})
    assert len(objective.metric_losses) == 4
    assert len({id(loss.beta) for loss in objective.metric_losses}) == 4  # a boundary per group and class
    assert all(loss.beta.shape == (5,) for loss in objective.metric_losses)
    groups = model.parameter_groups()
    assert set(groups) == {"pretrained", "key_value", "queries"}
    assert [p.shape for p in groups["queries"]] == [torch.Size([4, 4])]  # P x D_K, D_K = 32 // 8
    listed = [id(p) for params in groups.values() for p in params]
    assert sorted(listed) == sorted(id(p) for p in model.parameters()) and len(set(listed)) == len(listed)
    config = tiny_config(train={"weight_decay": 0.003, "groups": {"queries": {"weight_decay": 0.001}}})
    decays = {g["name"]: g["weight_decay"] for g in build_optimizer(model, objective, config.train).param_groups}
    assert decays == {"pretrained": 0.003, "key_value": 0.003, "queries": 0.001, "loss": 0.003}


def test_the_head_attends_on_the_trunk_output_and_drops_the_tail():
    model = create_model("tiny", head="dgml", pretrained=False, embedding_dim=16, split="stage2")
    assert model.head.in_channels == 16 and not hasattr(model.head, "tail")
    assert model(torch.rand(2, 3, 32, 32)).attention.shape == (2, 4, 8, 8)  # stride 4, not the tail's 8


def test_bad_head_options_are_named():
    with pytest.raises(ConfigError, match="groups must be at least 1"):
        create_model("tiny", head="dgml", pretrained=False, groups=0)
    with pytest.raises(ConfigError, match="too small for 8 groups"):
        create_model("tiny", head="dgml", pretrained=False, embedding_dim=4, groups=8)
    with pytest.raises(ConfigError, match="no option 'query_dim'.*did you mean 'key_dim'"):
        create_model("tiny", head="dgml", pretrained=False, query_dim=4)
    with pytest.raises(ConfigError, match="key_dim must be at least 1"):
        create_model("tiny", head="dgml", pretrained=False, key_dim=0)


def slow_diversity(parts, alpha=2.0, mu=0.5, scale=25.0, normalization="groups_minus_one"):
    """Eq. 4 by explicit loops over group pairs and images."""
    groups, images = len(parts), len(parts[0])
    total, pairs = 0.0, 0
    for i in range(groups):
        for j in range(i + 1, groups):
            pairs += 1
            terms = []
            for n in range(images):
                s = float(parts[i][n] @ parts[j][n] / (parts[i][n].norm() * parts[j][n].norm()))
                terms.append(math.log1p(math.exp(alpha * scale * (s - mu))))
            total += sum(terms) / images
    if groups < 2:
        return 0.0
    return total / (groups - 1 if normalization == "groups_minus_one" else pairs)


def random_parts(groups=4, batch=6, dim=5, seed=0, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    shared = torch.randn(batch, dim, generator=g, dtype=torch.float64)
    return [F.normalize(shared + spread * torch.randn(batch, dim, generator=g, dtype=torch.float64), dim=1)
            for _ in range(groups)]


@pytest.mark.parametrize("normalization", ["groups_minus_one", "pairs"])
@pytest.mark.parametrize(("scale", "groups", "seed"), [(25.0, 4, 0), (25.0, 3, 1), (1.0, 4, 2), (25.0, 2, 3)])
def test_diversity_loss_matches_a_slow_loop(normalization, scale, groups, seed):
    parts = random_parts(groups=groups, seed=seed, spread=0.6)
    output = HeadOutput(embedding=torch.cat(parts, dim=1), parts=parts)
    value = float(DiversityLoss(scale=scale, normalization=normalization)(output, torch.zeros(6)))
    expected = slow_diversity(parts, scale=scale, normalization=normalization)
    # torch's softplus is linear above 20, where log(1 + e^x) - x < e^-20 = 2e-9
    assert value == pytest.approx(expected, abs=1e-8) and expected > 1e-3


def test_diversity_loss_is_zero_for_one_group_and_flat_for_orthogonal_groups():
    one = random_parts(groups=1)
    assert float(DiversityLoss()(HeadOutput(embedding=one[0], parts=one), None)) == 0.0
    rotations = torch.linalg.qr(torch.randn(6, 8, 8, generator=torch.Generator().manual_seed(0),
                                            dtype=torch.float64)).Q  # per image, an orthonormal basis
    parts = [rotations[:, :, g].clone().requires_grad_(True) for g in range(4)]  # cos = 0 between groups
    loss = DiversityLoss()(HeadOutput(embedding=torch.cat(parts, dim=1), parts=parts), None)
    loss.backward()
    assert float(loss.detach()) < 1e-9
    assert max(float(p.grad.abs().max()) for p in parts) < 1e-9
    close = [p.detach().clone().requires_grad_(True) for p in random_parts(spread=0.1)]  # nearly equal groups
    DiversityLoss()(HeadOutput(embedding=torch.cat(close, dim=1), parts=close), None).backward()
    assert max(float(p.grad.abs().max()) for p in close) > 1e-2


def test_diversity_loss_is_log_2_at_the_margin_and_rejects_unknown_normalisation():
    base = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    at_mu = torch.tensor([[0.5, math.sqrt(0.75)]], dtype=torch.float64)  # cos = 0.5 = mu
    output = HeadOutput(embedding=torch.cat([base, at_mu], dim=1), parts=[base, at_mu])
    assert float(DiversityLoss()(output, None)) == pytest.approx(math.log(2), rel=1e-12)
    with pytest.raises(ConfigError, match="normalization must be one of"):
        DiversityLoss(normalization="mean")


@pytest.mark.parametrize("arch", ["googlenet", "resnet50"])
def test_presets_train_the_codes_epochs_with_its_multistep_schedule(arch):
    """The authors' code: CUB 100 epochs (x0.3 from epoch 55), Cars 200 (from 100), SOP 150 (from 100), an epoch
    being floor(training images / 112) batches."""
    from pathlib import Path

    from deepmetric.config import load_yaml
    from deepmetric.data.benchmarks import PUBLISHED

    for data, epochs, milestone in (("cub", 100, 55), ("cars", 200, 100), ("sop", 150, 100)):
        config = build_config(load_yaml(Path(__file__).parent.parent / "configs" / f"{data}-{arch}-dgml.yaml"))
        batch = config.data.classes_per_batch * config.data.samples_per_class
        per_epoch = PUBLISHED[data]["train"] // batch
        assert batch == 112 and config.train.steps == epochs * per_epoch
        assert (config.train.lr_schedule, config.train.lr_milestones, config.train.lr_gamma) == (
            "step", [milestone * per_epoch], 0.3)
