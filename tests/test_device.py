"""Device choice without a GPU: ``train.device`` names resolved as torch's CUDA calls need them. torch's own
argument check (``torch.cuda._utils._get_device_index``, which ``torch.cuda.set_device`` runs first) needs no GPU,
so the fakes below refuse exactly what the real call refuses: ``cuda`` without an index, which crashed every
``train.device=cuda`` run on a GPU machine until it was seen on one (2026-11-26, an H200)."""

from __future__ import annotations

import pytest
import torch

from deepmetric.devices import resolve_device
from deepmetric.errors import DeepMetricError


@pytest.fixture
def two_gpus(monkeypatch):
    """torch sees two CUDA devices; returns the indices ``torch.cuda.set_device`` was called with."""
    from torch.cuda._utils import _get_device_index

    chosen: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: chosen.append(_get_device_index(device)))
    return chosen


@pytest.mark.parametrize(("name", "local_rank", "expected"), [
    ("cuda", 0, "cuda:0"), ("cuda", 1, "cuda:1"), ("auto", 1, "cuda:1"), ("cuda:1", 0, "cuda:1"), ("cpu", 1, "cpu")])
def test_a_gpu_name_becomes_an_indexed_device_and_the_current_one(two_gpus, name, local_rank, expected):
    device = resolve_device(name, local_rank)
    assert device == torch.device(expected)
    assert two_gpus == ([device.index] if device.type == "cuda" else [])


def test_the_real_set_device_check_refuses_cuda_without_an_index():
    """What the fixture relies on: torch's check of ``set_device``'s argument raises without a GPU as with one."""
    from torch.cuda._utils import _get_device_index

    with pytest.raises(ValueError, match="specified index"):
        _get_device_index(torch.device("cuda"))


def test_a_gpu_that_is_not_there_is_one_clear_error(two_gpus, monkeypatch):
    with pytest.raises(DeepMetricError, match=r"train.device=cuda:2 is GPU 2, but torch sees 2 CUDA device\(s\)"):
        resolve_device("cuda:2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeepMetricError, match="train.device=cuda but torch sees no CUDA device"):
        resolve_device("cuda")
    with pytest.raises(DeepMetricError, match="^device=cuda but torch sees no CUDA device"):
        resolve_device("cuda", setting="device")  # a command's --device (search, serve) or load_run(device=...)
    assert resolve_device("auto") == torch.device("cpu")


@pytest.mark.parametrize(("cpus", "processes", "expected"), [(16, 1, 12), (8, 1, 7), (16, 4, 3), (1, 1, 0)])
def test_workers_default_to_none_on_the_cpu_and_to_what_feeds_a_gpu(monkeypatch, cpus, processes, expected):
    from deepmetric.data.torch_dataset import loader_workers

    monkeypatch.setattr("os.cpu_count", lambda: cpus)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(processes))
    assert loader_workers(None, "cpu") == 0
    assert loader_workers(None, torch.device("cuda", 1)) == expected
    assert loader_workers(5, "cuda") == 5 and loader_workers(0, "cuda") == 0 and loader_workers(3, "cpu") == 3


def test_batches_are_pinned_by_default_on_a_gpu_only():
    from deepmetric.data.torch_dataset import loader_pins

    assert loader_pins(None, "cuda:0") and not loader_pins(None, "cpu")
    assert not loader_pins(False, "cuda") and loader_pins(True, "cpu")


def test_the_trainer_and_the_evaluator_pass_the_config_and_their_device_to_the_loaders(tmp_path, monkeypatch):
    """The config's ``data.num_workers`` and ``data.pin_memory`` (None by default) reach the loaders with the
    device they feed, where the defaults are resolved."""
    import deepmetric.evaluation.evaluator as evaluator
    import deepmetric.training.trainer as trainer
    from deepmetric.config import DataConfig
    from helpers import tiny_config

    assert DataConfig().num_workers is None and DataConfig().pin_memory is None
    seen = []

    def recorder(real):
        def loader(dataset, *args):
            workers, pin, device = args[-3:]
            seen.append((workers, pin, torch.device(device)))
            return real(dataset, *args)
        return loader

    monkeypatch.setattr(trainer, "training_loader", recorder(trainer.training_loader))
    monkeypatch.setattr(evaluator, "inference_loader", recorder(evaluator.inference_loader))
    from deepmetric.workflows import evaluate_run

    trainer.train(tiny_config(data={"pin_memory": False}, train={"steps": 2}), tmp_path / "run", progress=False)
    assert seen == [(None, False, torch.device("cpu"))]  # the training batches
    evaluate_run(tmp_path / "run", progress=False)
    assert seen[1:] == [(None, False, torch.device("cpu"))]  # the test split's embeddings


# ---- device placement of every plug-in, proven without a GPU ------------------------------------------------------
# Inside ``tensors_need_a_device`` torch's default device is ``meta``: a tensor that a plug-in makes without naming a
# device (``torch.zeros(n)``, ``torch.tensor([...])``, ``torch.arange(k)``) lands on ``meta`` and the first operation
# that meets the CPU inputs fails, where on a GPU it would have landed on the CPU beside CUDA inputs. Tensors made
# with ``device=x.device`` or ``*_like(x)`` stay with their inputs. The model, the objective and the inputs are built
# before (on the CPU), and every optimiser's step (the generator's own included) runs with the default lifted: Adam
# makes its step counters on the CPU on purpose, and older torch without naming the device (found on a GPU
# machine's torch 2.11, where MIRAGE's discriminator step failed on a ``meta`` step counter).


class tensors_need_a_device:
    def __enter__(self):
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._hooks = (register_optimizer_step_pre_hook(lambda *_: torch.set_default_device(None)),
                       register_optimizer_step_post_hook(lambda *_: torch.set_default_device("meta")))
        torch.set_default_device("meta")

    def __exit__(self, *exc):
        torch.set_default_device(None)
        for hook in self._hooks:
            hook.remove()


def _train_and_embed(config, steps_in=tensors_need_a_device):
    """Build the run's model, objective and generator on the CPU; then, with factories defaulting to ``meta``: a
    training forward, the objective (with generated examples) and backward, the generator's own step, and an
    evaluation forward."""
    from deepmetric.generators import build_generator
    from deepmetric.losses import build_objective
    from deepmetric.models import create_model

    torch.manual_seed(0)
    m = config.model
    model = create_model(m.backbone, head=m.head, embedding_dim=m.embedding_dim, pretrained=False,
                         **m.head_options)
    labels = torch.arange(4).repeat_interleave(3)
    images = torch.rand(len(labels), 3, 32, 32)
    model.train()
    if model.head.init_images:
        model.initialize_head(iter([images]))
    objective = build_objective(config.loss, model.head, num_classes=4)
    generator = None
    if config.generator.name:
        generator = build_generator(config.generator.name, config.generator.options, head=model.head, num_classes=4,
                                    batch_size=len(labels), lr=1e-3, seed=0)
    with steps_in():
        output = model(images)
        generated = generator.generate(output, labels) if generator is not None else None
        loss, _ = objective(output, labels, generated.rows() if generated is not None else None)
        loss.backward()
        if generator is not None:
            generator.step(output, labels)
        model.eval()
        with torch.no_grad():
            embedding = model(images).embedding
    assert embedding.device.type == "cpu" and torch.isfinite(loss)


from test_cuda import CASES as PLUG_INS  # noqa: E402  (every head, loss, regulariser and the generator)


@pytest.mark.parametrize("case", list(PLUG_INS))
def test_no_plug_in_makes_a_tensor_without_naming_its_device(case):
    if "pml" in case:
        pytest.importorskip("pytorch_metric_learning")
    from helpers import tiny_config

    _train_and_embed(tiny_config(**PLUG_INS[case]))


def test_the_device_check_catches_a_tensor_made_without_a_device():
    """The mechanism itself: the same step with a plug-in that makes ``torch.ones(n)`` fails; with
    ``torch.ones(n, device=x.device)`` it passes."""
    from helpers import tiny_config

    class Careless(torch.nn.Module):
        def forward(self, output, labels):
            return (output.embedding.sum(dim=1) * torch.ones(len(labels))).mean()

    class Careful(torch.nn.Module):
        def forward(self, output, labels):
            return (output.embedding.sum(dim=1) * torch.ones(len(labels), device=labels.device)).mean()

    from deepmetric.losses import REGULARIZERS

    for name, cls in (("careful", Careful), ("careless", Careless)):
        REGULARIZERS.register(name, cls)
    try:
        _train_and_embed(tiny_config(loss={"regularizers": {"careful": {"weight": 1.0}}}))
        with pytest.raises((RuntimeError, NotImplementedError)):
            _train_and_embed(tiny_config(loss={"regularizers": {"careless": {"weight": 1.0}}}))
    finally:
        for name in ("careful", "careless"):
            REGULARIZERS.unregister(name)
