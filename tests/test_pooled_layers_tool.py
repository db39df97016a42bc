"""tools/pooled_layers.py: the untrained pooled features of every layer in one pass, as the run's own baseline
computes them at the last layer."""


import pytest
import torch

from deepmetric.errors import ConfigError
from deepmetric.models import create_model
from deepmetric.models.backbones import create_backbone
from helpers import load_tool


def test_the_last_layer_pools_as_the_untrained_baseline_and_an_inner_layer_stops_there():
    tool = load_tool("pooled_layers")
    images = torch.rand(3, 3, 32, 32)
    torch.manual_seed(0)
    model = tool.pooled_layers_model(create_backbone("tiny", pretrained=False), ["stage2", "stage3"])
    torch.manual_seed(0)
    baseline = create_model(backbone="tiny", head="gap", embedding_dim=0, pretrained=False)  # untrained_baseline's
    with torch.no_grad():
        pooled = model.eval()(images).extras
    torch.testing.assert_close(pooled["stage3"], baseline.embed(images))
    inner = create_backbone("tiny", pretrained=False, split="stage2")
    inner.trunk.load_state_dict(model.head.stages[: len(inner.trunk)].state_dict())
    feature_map = inner.trunk.eval()(model.normalize(images))
    assert pooled["stage2"].shape[1] == feature_map.shape[1] < 32
    torch.testing.assert_close(pooled["stage2"], torch.nn.functional.normalize(feature_map.mean(dim=(2, 3))))


def test_an_unknown_layer_is_named_with_the_nearest_one():
    with pytest.raises(ConfigError, match="no layer 'stage9' \\(did you mean 'stage3'\\?\\)"):
        load_tool("pooled_layers").pooled_layers_model(create_backbone("tiny", pretrained=False), ["stage9"])
