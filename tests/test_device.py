"""Device choice without a GPU: ``train.device`` names resolved as torch's CUDA calls need them. torch's own
argument check (``torch.cuda._utils._get_device_index``, which ``torch.cuda.set_device`` runs first) needs no GPU,
so the fakes below refuse exactly what the real call refuses: ``cuda`` without an index, which crashed every
``train.device=cuda`` run on a GPU machine until it was seen on one (2026-11-26, an H200)."""

from __future__ import annotations

import pytest
import torch

from deepmetric.errors import DeepMetricError
from deepmetric.training.setup import resolve_device


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
