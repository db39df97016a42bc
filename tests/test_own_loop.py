"""The parts of the trainer that a training loop of one's own uses (docs/own-loop.md): ``create_objective`` builds the
run config's objective by name, and ``deepmetric.training`` / ``deepmetric.data`` name what ``train`` calls.
"""

from __future__ import annotations

import pytest
import torch


def test_the_trainer_parts_are_public():
    """What the page imports from the package's public modules, and what ``deepmetric.training`` names for a loop of
    one's own, are there (and ``ImageDataset`` is the torch dataset the trainer uses)."""
    import deepmetric.data
    import deepmetric.training
    from deepmetric.data.torch_dataset import ImageDataset

    assert deepmetric.data.ImageDataset is ImageDataset and "ImageDataset" in deepmetric.data.__all__
    for name in ("seed_everything", "build_model", "load_table", "initialize_head", "build_optimizer",
                 "apply_schedule", "selection_key"):
        assert callable(getattr(deepmetric.training, name)) and name in deepmetric.training.__all__, name


def _head(name: str = "gap", **options):
    import deepmetric

    torch.manual_seed(0)
    return deepmetric.create_model(backbone="tiny", head=name, embedding_dim=16, pretrained=False, **options)


def _output_and_labels(model):
    torch.manual_seed(1)
    images = torch.rand(8, 3, 16, 16)
    return model(images), torch.arange(4).repeat_interleave(2)


@pytest.mark.parametrize("loss, options, head, head_options", [
    ("binomial", None, "gap", {}),
    ("margin", {"margin": 0.3}, "gap", {}),  # a loss with per-class parameters
    ("triplet", None, "abe", {"num_learners": 2}),  # a head with its own default regulariser and per-part losses
])
def test_create_objective_is_the_run_configs_objective(loss, options, head, head_options):
    """``create_objective(head, name, options, num_classes=)`` builds what ``build_objective`` builds from a run
    config's ``loss`` section with those keys: the same terms, the same values, the same parameters."""
    from deepmetric.config import LossConfig
    from deepmetric.losses import build_objective, create_objective

    model = _head(head, **head_options)
    output, labels = _output_and_labels(model)
    by_name = create_objective(model.head, loss, options, num_classes=4)
    from_config = build_objective(LossConfig(name=loss, options=dict(options or {})), model.head, num_classes=4)
    assert by_name.on == from_config.on and by_name.parts_reduction == from_config.parts_reduction
    assert list(by_name.regularizers) == list(from_config.regularizers) and by_name.weights == from_config.weights
    assert by_name.num_classes == 4
    total, terms = by_name(output, labels)
    expected_total, expected_terms = from_config(output, labels)
    assert terms.keys() == expected_terms.keys() and torch.equal(total, expected_total)
    assert [n for n, _ in by_name.named_parameters()] == [n for n, _ in from_config.named_parameters()]
    if head == "abe":
        assert by_name.on == "parts" and "divergence" in terms  # the head's defaults were taken


def test_create_objective_takes_the_sections_other_keys():
    """``regularizers={}`` drops the head's defaults, ``on`` and ``parts_reduction`` override the head's choices,
    and a bad option is the config's one message naming the loss."""
    from deepmetric.errors import ConfigError
    from deepmetric.losses import create_objective

    head = _head("abe", num_learners=2).head
    bare = create_objective(head, "binomial", regularizers={}, on="embedding")
    assert not bare.regularizers and bare.on == "embedding"
    summed = create_objective(head, "binomial", parts_reduction="sum", regularizers={"divergence": {"weight": 0.5}})
    assert summed.parts_reduction == "sum" and summed.weights == {"divergence": 0.5}
    with pytest.raises(ConfigError, match="binomial"):
        create_objective(head, "binomial", {"alpah": 2.0})
