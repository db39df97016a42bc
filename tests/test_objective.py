"""The objective (metric loss on the embedding or per part, regularisers) and the optimiser's groups."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from deepmetric import create_model
from deepmetric.config import build_config
from deepmetric.errors import ConfigError
from deepmetric.losses import REGULARIZERS, ContrastiveLoss, Objective, build_objective, register_regularizer
from deepmetric.models.heads import HeadOutput
from deepmetric.training.optim import build_optimizer
from helpers import tiny_config


def output_with_parts(n_parts=3, batch=8, dim=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    parts = [F.normalize(torch.randn(batch, dim, generator=g), dim=1) for _ in range(n_parts)]
    embedding = F.normalize(torch.cat(parts, dim=1), dim=1)
    return HeadOutput(embedding=embedding, parts=parts), torch.arange(batch // 2).repeat_interleave(2)


def test_metric_on_parts_mean_and_sum():
    output, labels = output_with_parts()
    loss = ContrastiveLoss()
    per_part = [float(loss(p, labels)) for p in output.parts]
    mean = Objective(loss, on="parts", parts_reduction="mean")(output, labels)[0]
    total = Objective(loss, on="parts", parts_reduction="sum")(output, labels)[0]
    assert float(mean) == pytest.approx(sum(per_part) / 3) and float(total) == pytest.approx(sum(per_part))
    assert float(Objective(loss)(output, labels)[0]) == pytest.approx(float(loss(output.embedding, labels)))


class CountingRegularizer(nn.Module):
    """Mean squared embedding entry: a stand-in regulariser."""

    def __init__(self, scale: float = 1.0, head=None):
        super().__init__()
        self.scale, self.head = scale, head

    def forward(self, output, labels):
        return self.scale * output.embedding.pow(2).mean()


@pytest.fixture
def counting_regularizer():
    register_regularizer("counting", CountingRegularizer)
    yield
    REGULARIZERS.unregister("counting")


def test_regularizers_are_weighted_and_logged(counting_regularizer):
    output, labels = output_with_parts()
    config = build_config({"loss": {"name": "contrastive", "regularizers": {"counting": {"weight": 0.5, "scale": 2}}}})
    model = create_model("tiny", pretrained=False, embedding_dim=8)
    objective = build_objective(config.loss, model.head)
    total, terms = objective(output, labels)
    assert set(terms) == {"metric", "counting"} and objective.regularizers["counting"].head is model.head
    assert float(total) == pytest.approx(float(terms["metric"]) + 0.5 * float(terms["counting"]))
    assert float(terms["counting"]) == pytest.approx(2 * float(output.embedding.pow(2).mean()))
    with pytest.raises(ConfigError, match="no option 'scal'.*did you mean 'scale'"):
        build_objective(build_config({"loss": {"regularizers": {"counting": {"scal": 1}}}}).loss, model.head)
    with pytest.raises(ConfigError, match="unknown regularizer 'countin'"):
        build_objective(build_config({"loss": {"regularizers": {"countin": {}}}}).loss, model.head)


def test_head_defaults_apply_unless_the_config_overrides(counting_regularizer, monkeypatch):
    model = create_model("tiny", pretrained=False, embedding_dim=8)
    monkeypatch.setattr(type(model.head), "metric_on", "parts")
    monkeypatch.setattr(type(model.head), "parts_reduction", "sum")
    monkeypatch.setattr(type(model.head), "default_regularizers", {"counting": {"weight": 3.0}})
    objective = build_objective(build_config({}).loss, model.head)
    assert (objective.on, objective.parts_reduction, objective.weights) == ("parts", "sum", {"counting": 3.0})
    plain = build_objective(build_config({"loss": {"on": "embedding", "regularizers": {}}}).loss, model.head)
    assert (plain.on, dict(plain.regularizers)) == ("embedding", {})


def test_per_part_losses_keep_their_own_parameters(monkeypatch):
    model = create_model("tiny", pretrained=False, embedding_dim=8)
    monkeypatch.setattr(type(model.head), "num_parts", property(lambda self: 3))
    config = build_config({"loss": {"name": "margin", "on": "parts", "options": {"per_class": True}}})
    objective = build_objective(config.loss, model.head, num_classes=5)
    betas = [loss.beta for loss in objective.metric_losses]
    assert len(betas) == 3 and len({id(b) for b in betas}) == 3


def test_optimizer_groups_scales_and_weight_decay():
    config = tiny_config(train={"lr": 1e-3, "lr_backbone": 1e-4, "weight_decay": 1e-5,
                                "groups": {"new": {"lr_scale": 10, "weight_decay": 0.0}}},
                         loss={"name": "margin"})
    model = create_model("tiny", pretrained=False, embedding_dim=8)
    objective = build_objective(config.loss, model.head, num_classes=3)
    groups = {g["name"]: g for g in build_optimizer(model, objective, config.train).param_groups}
    assert set(groups) == {"pretrained", "new", "loss"}
    assert groups["new"]["lr"] == pytest.approx(1e-2) and groups["new"]["weight_decay"] == 0.0
    assert groups["pretrained"]["lr"] == pytest.approx(1e-4) and groups["pretrained"]["weight_decay"] == 1e-5
    assert groups["loss"]["lr"] == pytest.approx(1e-3)
    n_params = sum(len(g["params"]) for g in groups.values())
    assert n_params == len([p for p in model.parameters() if p.requires_grad]) + 1
    bad = tiny_config(train={"groups": {"queries": {"lr_scale": 2}}})
    with pytest.raises(ConfigError, match="parameter groups are"):
        build_optimizer(model, objective, bad.train)


@pytest.mark.parametrize(("on", "reduction"), [("parts", "mean"), ("parts", "sum"), ("embedding", "mean")])
def test_generated_rows_join_the_batch_cut_into_the_parts(on, reduction):
    """Generated rows (MIRAGE, thesis eq. 6.2: x~ in the embedding space) join the metric loss with their labels:
    on the embedding they are appended as they are; per part, each row is cut into the parts' widths (3, 2, 4
    here), each piece l2-normalised like a part, and appended to its part; labels follow the rows."""
    g = torch.Generator().manual_seed(5)
    parts = [F.normalize(torch.randn(6, d, generator=g), dim=1) for d in (3, 2, 4)]
    output = HeadOutput(embedding=F.normalize(torch.cat(parts, dim=1), dim=1), parts=parts)
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    extra, extra_labels = torch.randn(4, 9, generator=g), torch.tensor([3, 3, 1, 0])
    losses = [ContrastiveLoss(margin=0.1), ContrastiveLoss(margin=0.3), ContrastiveLoss(margin=0.2)]
    both = torch.cat([labels, extra_labels])
    if on == "embedding":
        objective = Objective(losses[0], on="embedding")
        expected = float(losses[0](torch.cat([output.embedding, extra]), both))
    else:
        objective = Objective(losses, on="parts", parts_reduction=reduction)
        pieces = (extra[:, :3], extra[:, 3:5], extra[:, 5:])
        per_part = [float(loss(torch.cat([p, F.normalize(q, dim=1)]), both))
                    for loss, p, q in zip(losses, parts, pieces, strict=True)]
        expected = sum(per_part) / (3 if reduction == "mean" else 1)
    total, terms = objective(output, labels, (extra, extra_labels))
    assert float(terms["metric"]) == pytest.approx(expected, abs=1e-6)
    assert float(terms["metric"]) != pytest.approx(float(objective(output, labels)[1]["metric"]), abs=1e-4)
