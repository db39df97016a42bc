"""tools/pooled_layers.py: the untrained pooled features of one layer, as the run's own baseline computes them."""

import importlib.util
from pathlib import Path

import torch

from deepmetric.models import create_model

TOOL = Path(__file__).parents[1] / "tools" / "pooled_layers.py"


def load_tool():
    spec = importlib.util.spec_from_file_location("pooled_layers", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_last_layer_pools_as_the_untrained_baseline_and_an_inner_layer_stops_there():
    tool = load_tool()
    images = torch.rand(3, 3, 32, 32)
    torch.manual_seed(0)
    last = tool.pooled_model("tiny", "stage3", pretrained=False, freeze_bn=True)
    torch.manual_seed(0)
    baseline = create_model(backbone="tiny", head="gap", embedding_dim=0, pretrained=False)  # untrained_baseline's
    torch.testing.assert_close(last.embed(images), baseline.embed(images))
    inner = tool.pooled_model("tiny", "stage2", pretrained=False, freeze_bn=True)
    feature_map = inner.trunk(inner.normalize(images))
    assert inner.embedding_dim == feature_map.shape[1] < 32
    torch.testing.assert_close(inner.embed(images), torch.nn.functional.normalize(feature_map.mean(dim=(2, 3))))
