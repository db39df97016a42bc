"""Shared fixtures."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
import tqdm

from deepmetric.data.table import RetrievalTable
from helpers import make_table

# tqdm's bars (every bar, even a disabled one) take its write lock, by default a multiprocessing lock that forked
# processes share: a child killed while holding it (a mutation run's mutant past its time limit) leaves it taken for
# every later child of the run. A lock of this process alone, and no monitor thread (which takes it every 10 s).
tqdm.tqdm.set_lock(threading.RLock())
tqdm.tqdm.monitor_interval = 0


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    np.random.seed(0)


@pytest.fixture
def blob_table() -> RetrievalTable:
    return make_table()


@pytest.fixture
def aot_eager_compile(monkeypatch):
    """``torch.compile`` with the ``aot_eager`` backend (``models/compiled.py``'s ``BACKEND``): dynamo and AOTAutograd
    trace the graphs inductor would compile, without the minutes of code generation a CPU needs; dynamo's caches
    emptied before and after."""
    import deepmetric.models.compiled as compiled

    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """A run directory of the tiny test backbone trained for 2 steps (16-d embeddings, 16 px images)."""
    from deepmetric.cli import main

    out = tmp_path_factory.mktemp("tiny-run") / "run"
    code = main(["train", "--data", "digits", "--backbone", "tiny", "--steps", "2", "--quiet", "--no-test",
                 "--out", str(out), "model.pretrained=false", "model.embedding_dim=16", "data.image_size=16",
                 "data.classes_per_batch=3", "data.samples_per_class=4", "eval.nmi=false"])
    assert code == 0
    return out
