"""The head contract (``models/heads/base.py``), checked over every registered head, as timm's
``test_model_backward`` runs over every model: a new head is checked by registering it.

Each head is built on the tiny test backbone (random weights, 64-px images) with its default options and its
paper's objective (``build_objective`` with the head's defaults), then one forward and backward pass.
"""

from __future__ import annotations

import pytest
import torch

from deepmetric.config import LossConfig
from deepmetric.losses import build_objective
from deepmetric.models import create_model
from deepmetric.models.heads import HEADS, Head

EMBEDDING_DIM = 72  # splits evenly over every default learner count (1, 4, 8, 9)
LABELS = torch.tensor([0, 0, 1, 1, 2, 2])


def _build(name: str):
    torch.manual_seed(0)
    model = create_model(backbone="tiny", head=name, embedding_dim=EMBEDDING_DIM, pretrained=False)
    objective = build_objective(LossConfig(), model.head, num_classes=3)
    return model, objective


@pytest.fixture(params=list(HEADS))
def trained_step(request):
    """(name, model, objective, training-mode output, terms) after one backward pass. Built for each test (not once
    per module): mutation testing credits a forward pass to the test that ran it, and the passes are cheap."""
    model, objective = _build(request.param)
    model.train()
    output = model(torch.rand(len(LABELS), 3, 64, 64, generator=torch.Generator().manual_seed(1)))
    loss, terms = objective(output, LABELS)
    loss.backward()
    return request.param, model, objective, output, terms


def _unit_rows(x: torch.Tensor) -> bool:
    return torch.allclose(x.norm(dim=1), torch.ones(len(x)), atol=1e-5)


def test_every_head_is_a_head_with_an_embedding_of_its_declared_size(trained_step):
    name, model, _, output, _ = trained_step
    head = model.head
    assert isinstance(head, Head), name
    assert output.embedding.shape == (len(LABELS), head.embedding_dim) == (len(LABELS), model.embedding_dim)
    assert head.embedding_dim == EMBEDDING_DIM, name  # the size asked for (it splits evenly over every learner)
    assert torch.isfinite(output.embedding).all()
    if head.normalized:
        assert _unit_rows(output.embedding), name


def test_parts_are_num_parts_unit_norm_learners(trained_step):
    name, model, _, output, _ = trained_step
    assert len(output.parts) == model.head.num_parts, name
    for part in output.parts:
        assert part.shape[0] == len(LABELS) and _unit_rows(part), name


def test_every_parameter_is_in_exactly_one_group(trained_step):
    name, model, objective, _, _ = trained_step
    head_groups = model.head.parameter_groups()
    ids = [id(p) for params in head_groups.values() for p in params]
    assert sorted(ids) == sorted(id(p) for p in model.head.parameters()), name  # the head's groups: each once
    model_groups = model.parameter_groups()
    ids = [id(p) for params in model_groups.values() for p in params]
    trainable = [id(p) for p in model.parameters() if p.requires_grad]
    assert len(ids) == len(set(ids)) and set(ids) == set(trainable), name
    assert set(model.head.default_groups) <= set(model_groups) | {"loss"}, name  # defaults name groups that exist


def test_every_trainable_parameter_gets_a_gradient_from_the_objective(trained_step):
    name, model, objective, _, terms = trained_step
    assert set(terms) >= {"metric"} | set(objective.regularizers), name
    parameters = list(model.named_parameters()) + [(f"objective.{n}", p) for n, p in objective.named_parameters()]
    silent = [n for n, p in parameters if p.requires_grad and (p.grad is None or not p.grad.abs().sum() > 0)]
    assert not silent, f"{name}: no gradient reaches {silent[:5]}"


def test_attention_maps_match_their_count_and_label(trained_step):
    name, model, _, output, _ = trained_step
    head = model.head
    with torch.no_grad():  # as declared, in training and in eval mode (explain reads the declaration alone)
        evaluated = model.eval()(torch.rand(2, 3, 64, 64)).attention
    assert head.has_attention_maps == (output.attention is not None) == (evaluated is not None), name
    if output.attention is None:
        return
    assert output.attention.dim() == 4 and output.attention.shape[:2] == (len(LABELS), head.num_maps), name
    assert head.part_name != "map", f"{name} returns attention maps but does not name them (part_name)"
    assert torch.isfinite(output.attention).all()


def test_optional_hooks_hold_what_they_promise(trained_step):
    name, model, _, output, _ = trained_step
    head = model.head
    if head.feature_channels is not None and "feature_map" in output.extras:
        assert output.extras["feature_map"].shape[1] == head.feature_channels, name
    if head.pooled_dim is not None:
        pooled = output.extras["pooled"]
        assert pooled.shape == (len(LABELS), head.pooled_dim)
        torch.testing.assert_close(head.encode(pooled), output.embedding)
    else:
        with pytest.raises(NotImplementedError):
            head.encode(torch.zeros(1, 4))
    if head.individual_learners:
        assert len(head.auxiliary_embeddings(output)) == head.num_parts, name
    for key, value in head.auxiliary_embeddings(output).items():
        assert key.partition(".")[0] and _unit_rows(value), (name, key)


def test_eval_mode_gives_the_same_shapes_without_gradients():
    for name in HEADS:
        model, _ = _build(name)
        images = torch.rand(3, 3, 64, 64, generator=torch.Generator().manual_seed(2))
        assert model.embed(images).shape == (3, model.embedding_dim), name
        assert model.training, name  # embed restores the mode it found


def test_learners_share_the_embedding_as_floor_d_over_m_and_an_uneven_split_is_said_once(caplog):
    """DeML §3.1's rule for every multi-learner head: floor(D / M) dimensions each; when M does not divide D the
    warning gives the dimensions actually used (M floor(D / M)) and each learner's share; an even split says nothing."""
    from deepmetric.errors import ConfigError
    from deepmetric.models.heads.base import learner_dim

    with caplog.at_level("WARNING", logger="deepmetric"):
        assert learner_dim("deml", 512, 9) == 56
        assert learner_dim("abe", 512, 8) == 64
        assert learner_dim("abe", 8, 8) == 1
    assert [r.getMessage() for r in caplog.records] == [
        "deml: model.embedding_dim=512 does not split evenly over 9 learners; the embedding has 504 dimensions "
        "(56 each)"]
    with pytest.raises(ConfigError, match="too small for 8 learners"):
        learner_dim("abe", 7, 8)
    with pytest.raises(ConfigError, match="at least one learner, got 0"):
        learner_dim("abe", 8, 0)


def test_gap_without_l2_leaves_the_embedding_unnormalised():
    """GAP's l2=False (MIRAGE's 2-D latent space, thesis Fig. 6.3b): the embedding is the linear map of the pooled
    features, not its unit vector."""
    model = create_model("tiny", head="gap", pretrained=False, embedding_dim=2, l2=False).eval()
    with torch.no_grad():
        output = model(torch.rand(3, 3, 32, 32))
        expected = model.head.embed(output.extras["pooled"])
    assert not model.head.normalized and torch.allclose(output.embedding, expected)
    assert not torch.allclose(output.embedding.norm(dim=1), torch.ones(3))


@pytest.mark.parametrize("name", list(HEADS))
def test_an_embedding_of_no_dimension_is_refused_except_gaps_pooled_features(name):
    """``model.embedding_dim=0`` is the gap head's "no projection" (the pooled backbone features); ``bilinear`` and
    ``jcf`` built a 0-d embedding and trained on it without a word. Every other head refuses it, naming the key."""
    from deepmetric.errors import ConfigError

    if name == "gap":
        model = create_model(backbone="tiny", head=name, embedding_dim=0, pretrained=False).eval()
        assert model(torch.rand(2, 3, 32, 32)).embedding.shape[1] == model.embedding_dim > 0  # the channels
        return
    with pytest.raises(ConfigError, match=r"model\.embedding_dim"):
        create_model(backbone="tiny", head=name, embedding_dim=0, pretrained=False)
