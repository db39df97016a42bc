"""pytorch-metric-learning's losses and miners through deepmetric's objective: the same values and gradients as PML's
own call, one copy per learner, the miner's pairs, the proxies' optimiser group, exact resumption, clear refusals."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import miners as pml_miners

from deepmetric.config import LossConfig, TrainConfig, build_config
from deepmetric.errors import ConfigError
from deepmetric.io.tensors import unprefixed
from deepmetric.losses import PMLLoss, build_loss, build_objective
from deepmetric.models import create_model
from deepmetric.models.heads import HeadOutput
from deepmetric.runs.checkpoint import load_checkpoint
from deepmetric.training import train
from deepmetric.training.optim import build_optimizer
from helpers import tiny_config

NUM_CLASSES, DIM = 6, 16
# one pair-based, one triplet-based, one proxy-based and one classification-based loss, with non-default options
CASES = {
    "ContrastiveLoss": ({"pos_margin": 0.1, "neg_margin": 0.6}, pml_losses.ContrastiveLoss),
    "TripletMarginLoss": ({"margin": 0.2}, pml_losses.TripletMarginLoss),
    "ProxyAnchorLoss": ({"margin": 0.1, "alpha": 16}, pml_losses.ProxyAnchorLoss),
    "ArcFaceLoss": ({"margin": 20.0, "scale": 32}, pml_losses.ArcFaceLoss),
}


def batch(seed=0, n=24):
    generator = torch.Generator().manual_seed(seed)
    embeddings = F.normalize(torch.randn(n, DIM, generator=generator), dim=1)
    labels = torch.arange(NUM_CLASSES).repeat(n // NUM_CLASSES)
    return embeddings, labels


def gap_head():
    return create_model(backbone="tiny", head="gap", embedding_dim=DIM, pretrained=False).head


@pytest.mark.parametrize("name", list(CASES))
def test_the_objective_equals_pmls_own_call_in_value_and_gradients(name):
    options, cls = CASES[name]
    torch.manual_seed(0)
    objective = build_objective(LossConfig(name=f"pml:{name}", options=options, regularizers={}), gap_head(),
                                num_classes=NUM_CLASSES)
    ours_module = objective.metric_losses[0]
    assert isinstance(ours_module, PMLLoss) and isinstance(ours_module.loss, cls)
    proxy_based = "num_classes" in cls.__init__.__code__.co_varnames
    kwargs = {"num_classes": NUM_CLASSES, "embedding_size": DIM} if proxy_based else {}
    reference = cls(**kwargs, **options)
    reference.load_state_dict(ours_module.loss.state_dict())  # the same proxies / class weights
    embeddings, labels = batch()
    ours_in = embeddings.clone().requires_grad_(True)
    theirs_in = embeddings.clone().requires_grad_(True)
    ours, _ = objective(HeadOutput(embedding=ours_in, parts=[ours_in]), labels)
    theirs = reference(theirs_in, labels)
    assert ours.item() > 0 and torch.allclose(ours, theirs, atol=1e-6)
    ours.backward()
    theirs.backward()
    assert torch.allclose(ours_in.grad, theirs_in.grad, atol=1e-6) and ours_in.grad.abs().sum() > 0
    for (key, mine), (_, their) in zip(ours_module.loss.named_parameters(), reference.named_parameters(), strict=True):
        assert torch.allclose(mine.grad, their.grad, atol=1e-6), key


def test_each_learner_gets_its_own_copy_sized_to_its_part():
    head = create_model(backbone="tiny", head="abe", embedding_dim=DIM, pretrained=False, num_learners=4).head
    objective = build_objective(LossConfig(name="pml:ProxyAnchorLoss", on="parts", regularizers={}), head,
                                num_classes=NUM_CLASSES)
    proxies = [m.loss.proxies for m in objective.metric_losses]
    assert len(proxies) == 4 and all(p.shape == (NUM_CLASSES, DIM // 4) for p in proxies)
    assert len({p.data_ptr() for p in proxies}) == 4  # separate parameters, not one shared


def test_a_miner_changes_which_pairs_the_loss_sees():
    embeddings, labels = batch(seed=3)
    mined = build_loss("pml:MultiSimilarityLoss", {}, miner="pml:MultiSimilarityMiner",
                       miner_options={"epsilon": 0.05})
    plain = build_loss("pml:MultiSimilarityLoss", {})
    miner = pml_miners.MultiSimilarityMiner(epsilon=0.05)
    indices = miner(embeddings, labels)
    reference = pml_losses.MultiSimilarityLoss()
    assert torch.allclose(mined(embeddings, labels), reference(embeddings, labels, indices))
    assert torch.allclose(plain(embeddings, labels), reference(embeddings, labels))
    assert len(indices[2]) < (labels[:, None] != labels[None]).sum()  # the miner dropped negative pairs ...
    assert not torch.allclose(mined(embeddings, labels), plain(embeddings, labels))  # ... and the loss moved


def test_proxies_train_in_the_loss_group_at_the_recommended_rate():
    model = create_model(backbone="tiny", head="gap", embedding_dim=DIM, pretrained=False)
    objective = build_objective(LossConfig(name="pml:ProxyAnchorLoss", regularizers={}), model.head, NUM_CLASSES)
    config = TrainConfig(lr=1e-3, lr_backbone=1e-4)
    groups = {g["name"]: g for g in build_optimizer(model, objective, config).param_groups}
    assert groups["loss"]["lr"] == pytest.approx(1e-2)  # 100 x the backbone's rate
    assert groups["loss"]["params"] == [objective.metric_losses[0].loss.proxies]
    groups = {g["name"]: g for g in build_optimizer(model, objective, TrainConfig(lr_loss=5e-3)).param_groups}
    assert groups["loss"]["lr"] == 5e-3
    plain = build_objective(LossConfig(name="pml:ContrastiveLoss", regularizers={}), model.head, NUM_CLASSES)
    assert "loss" not in {g["name"] for g in build_optimizer(model, plain, TrainConfig()).param_groups}


def test_a_proxy_loss_resumes_to_the_same_weights(tmp_path):
    loss = {"name": "pml:ProxyAnchorLoss", "options": {"alpha": 16}}
    train(tiny_config(loss=loss, train={"steps": 6}), tmp_path / "straight", progress=False)
    train(tiny_config(loss=loss, train={"steps": 3}), tmp_path / "resumed", progress=False)
    train(tiny_config(loss=loss, train={"steps": 6}), tmp_path / "resumed", resume=True, progress=False)
    straight, _ = load_checkpoint(tmp_path / "straight/checkpoints/last.safetensors")
    resumed, state = load_checkpoint(tmp_path / "resumed/checkpoints/last.safetensors")
    assert state["step"] == 6 and straight.keys() == resumed.keys()
    # the global RNG state is not compared: a resumed session draws one more DataLoader seed from it (the batches
    # and augmentations come from their own seeded streams, so the weights do not depend on it)
    assert all(torch.equal(straight[k], resumed[k]) for k in straight if not k.startswith("rng.")), \
        "model, proxies and optimiser state"
    key = "metric_losses.0.loss.proxies"
    assert key in unprefixed("objective", straight)
    train(tiny_config(loss=loss, train={"steps": 0}), tmp_path / "untrained", progress=False)
    untrained, _ = load_checkpoint(tmp_path / "untrained/checkpoints/last.safetensors")
    assert not torch.equal(unprefixed("objective", untrained)[key], unprefixed("objective", straight)[key])


def test_unknown_names_and_options_are_refused_with_the_nearest_before_any_data(tmp_path):
    with pytest.raises(ConfigError, match=r"no loss 'ProxyAnchor'.*did you mean 'ProxyAnchorLoss'"):
        build_config({"loss": {"name": "pml:ProxyAnchor"}})
    with pytest.raises(ConfigError, match=r"has no option 'alpah'.*did you mean 'alpha'"):
        build_config({"loss": {"name": "pml:ProxyAnchorLoss", "options": {"alpah": 16}}})
    with pytest.raises(ConfigError, match=r"no miner 'MultiSimilarity'.*did you mean 'MultiSimilarityMiner'"):
        build_config({"loss": {"name": "pml:MultiSimilarityLoss", "miner": "pml:MultiSimilarity"}})
    with pytest.raises(ConfigError, match=r"miner 'pml:MultiSimilarityMiner' has no option 'epsilom'"):
        build_config({"loss": {"name": "pml:MultiSimilarityLoss", "miner": "pml:MultiSimilarityMiner",
                               "miner_options": {"epsilom": 0.1}}})
    with pytest.raises(ConfigError, match=r"loss.miner=pml:MultiSimilarityMiner needs a pytorch-metric-learning loss"):
        build_config({"loss": {"name": "binomial", "miner": "pml:MultiSimilarityMiner"}})


def test_without_pml_the_name_is_refused_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "pytorch_metric_learning", None)
    monkeypatch.setitem(sys.modules, "pytorch_metric_learning.losses", None)
    with pytest.raises(ConfigError, match=r"need pytorch-metric-learning.*pip install 'deepmetric\[pml\]'"):
        build_config({"loss": {"name": "pml:ProxyAnchorLoss"}})


def test_two_processes_train_the_proxies_as_one_process_does(tmp_path):
    """Under distributed training the PML loss sees the all-gathered batch: 2 ranks x 6 images reach the weights and
    proxies of 1 process x 12 images (per learner: ABE's 2 learners each have their own proxies)."""
    from deepmetric.training.launch import launch

    config = tiny_config(train={"steps": 3, "threads": 1}, loss={"name": "pml:ProxyAnchorLoss", "on": "parts"},
                         model={"head": "abe", "head_options": {"num_learners": 2}})
    train(config, tmp_path / "one", progress=False)
    launch(config, tmp_path / "two", nproc=2, progress=False)
    one, _ = load_checkpoint(tmp_path / "one/checkpoints/last.safetensors")
    two, state = load_checkpoint(tmp_path / "two/checkpoints/last.safetensors")
    assert state["step"] == 3
    compared = [k for k in one if k.startswith(("model.", "objective."))]
    assert "objective.metric_losses.1.loss.proxies" in compared
    assert all(torch.allclose(one[k], two[k], atol=1e-6) for k in compared), \
        [k for k in compared if not torch.allclose(one[k], two[k], atol=1e-6)]


# losses that need options of their own (no default) or another call (VICReg: two views, no labels)
NEEDS_MORE = {"GenericPairLoss", "ManifoldLoss", "RankedListLoss", "VICRegLoss"}


def test_every_pml_loss_that_takes_the_class_count_or_width_gets_them_and_runs():
    """CosFace and SubCenterArcFace take num_classes/embedding_size through ``*args/**kwargs``, P2SGrad calls the
    width ``descriptors_dim``: each gets the run's values, and every loss with defaults runs on a batch."""
    from deepmetric.losses.pml import _classes

    names = sorted(set(_classes("loss")) - NEEDS_MORE)
    assert {"CosFaceLoss", "SubCenterArcFaceLoss", "P2SGradLoss", "ArcFaceLoss"} <= set(names)
    embeddings, labels = batch()
    for name in names:
        objective = build_objective(LossConfig(name=f"pml:{name}", regularizers={}), gap_head(),
                                    num_classes=NUM_CLASSES)
        loss, _ = objective(HeadOutput(embedding=embeddings, parts=[embeddings]), labels)
        assert torch.isfinite(loss), name
    cosface = build_loss("pml:CosFaceLoss", num_classes=NUM_CLASSES, embedding_size=DIM).loss
    assert cosface.num_classes == NUM_CLASSES and tuple(cosface.W.shape) == (DIM, NUM_CLASSES)


BAD_LOSSES = [  # (loss section, what the message names)
    ({"name": "pml:VICRegLoss"}, r"loss 'pml:VICRegLoss'"),
    ({"name": "pml:ManifoldLoss", "options": {"l": 8}}, r"pml:ManifoldLoss' \(l=8\)"),
    ({"name": "pml:TripletMarginLoss", "options": {"margin": "abc"}}, r"pml:TripletMarginLoss' \(margin='abc'\)"),
    ({"name": "pml:FastAPLoss", "options": {"num_bins": 0}}, r"pml:FastAPLoss' \(num_bins=0\)"),
    ({"name": "pml:PNPLoss", "options": {"variant": "evil"}}, r"pml:PNPLoss' \(variant='evil'\)"),
    ({"name": "pml:TripletMarginLoss", "miner": "pml:BatchEasyHardMiner", "miner_options": {"pos_strategy": "evil"}},
     r"miner 'pml:BatchEasyHardMiner' \(pos_strategy='evil'\)"),
    ({"name": "binomial", "options": {"alpha": "x"}}, r"loss 'binomial' \(alpha='x'\)"),
]


@pytest.mark.parametrize(("loss", "named"), BAD_LOSSES, ids=[str(b[0]) for b in BAD_LOSSES])
def test_a_loss_that_fails_on_a_trial_batch_is_refused_before_any_image_or_file(tmp_path, loss, named, monkeypatch):
    import deepmetric.training.session as session

    def no_images(*args, **kwargs):
        raise AssertionError("the data were read before the loss was tried")

    monkeypatch.setattr(session, "load_table", no_images)
    with pytest.raises(ConfigError, match=named) as caught:
        train(tiny_config(loss={"regularizers": {}, **loss}), tmp_path / "run", progress=False)
    assert "fails on a trial batch: " in str(caught.value) or "cannot be built: " in str(caught.value)
    assert not (tmp_path / "run").exists()


def test_study_dry_run_refuses_a_loss_that_fails_on_a_trial_batch():
    from deepmetric.studies.dry_run import _build

    config = tiny_config(loss={"name": "pml:FastAPLoss", "options": {"num_bins": 0}, "regularizers": {}})
    with pytest.raises(ConfigError, match=r"pml:FastAPLoss' \(num_bins=0\)"):
        _build(config)


def test_the_trial_batch_leaves_the_rng_and_the_loss_state_as_they_were():
    head = gap_head()
    torch.manual_seed(3)
    objective = build_objective(LossConfig(name="pml:ProxyAnchorLoss", regularizers={}), head,
                                num_classes=NUM_CLASSES)
    after_build = torch.get_rng_state()
    torch.manual_seed(3)
    reference = pml_losses.ProxyAnchorLoss(num_classes=NUM_CLASSES, embedding_size=DIM)
    assert torch.equal(objective.metric_losses[0].loss.proxies, reference.proxies)
    assert torch.equal(torch.get_rng_state(), after_build)  # the proxies' draw, and only it
    assert objective.metric_losses[0].loss.proxies.grad is None
