"""Helpers shared by the tests: small deterministic tables and a tiny-trunk config."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from deepmetric.config import build_config
from deepmetric.data.table import RetrievalTable


def make_table(n_classes: int = 8, per_class: int = 6, size: int = 24, seed: int = 0,
               test_from: int | None = None) -> RetrievalTable:
    """In-memory images where each class is a coloured blob at its own position (learnable, not trivial)."""
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for c in range(n_classes):
        cy, cx = (c * 5) % (size - 8) + 4, (c * 7) % (size - 8) + 4
        colour = rng.integers(60, 255, size=3)
        for _ in range(per_class):
            image = rng.integers(0, 40, size=(size, size, 3)).astype(np.uint8)
            y, x = cy + rng.integers(-2, 3), cx + rng.integers(-2, 3)
            image[max(0, y - 3):y + 3, max(0, x - 3):x + 3] = colour
            images.append(image)
            labels.append(c)
    labels_array = np.array(labels)
    test_from = n_classes // 2 if test_from is None else test_from
    splits = np.where(labels_array < test_from, "train", "test").astype(object)
    ones = np.ones(len(labels), dtype=bool)
    return RetrievalTable(name="blobs", images=np.stack(images), labels=labels_array, splits=splits,
                            is_query=ones, is_gallery=ones, recall_at=(1, 2, 4))


def tiny_config(**sections):
    """A run config on the tiny test backbone: CPU, small images, few steps."""
    base = {
        "data": {"spec": "digits", "image_size": 16, "classes_per_batch": 3, "samples_per_class": 4,
                 "resize_range": [1.0, 1.2]},
        "model": {"backbone": "tiny", "pretrained": False, "embedding_dim": 16},
        "train": {"steps": 6, "lr": 1e-3, "lr_backbone": 1e-3, "eval_every": 3, "checkpoint_every": 3,
                  "log_every": 1, "device": "cpu"},
        "eval": {"batch_size": 64, "nmi": False},
    }
    for section, values in sections.items():
        base.setdefault(section, {}).update(values)
    return build_config(base)


def record_audited_splits(monkeypatch) -> list[set[str]]:
    """Make the image audit record the splits of every table it checks (in call order); returns that list."""
    import deepmetric.runs.table as run_table

    audited, check = [], run_table.check_table
    monkeypatch.setattr(run_table, "check_table",
                        lambda table, *a: audited.append(set(table.splits)) or check(table, *a))
    return audited


def checkpoint(path):
    """(tensors, state) of a checkpoint file: ``model.*``, ``optim.*``, ``objective.*``, ``generator.*``, ``rng.*``."""
    from deepmetric.runs.checkpoint import load_checkpoint

    return load_checkpoint(path)


def train_straight_and_resumed(root, steps: int = 4, stop: int = 2, **sections):
    """Train ``tiny_config(**sections)`` for ``steps`` in one run (``root/straight``) and, in ``root/resumed``, for
    ``stop`` steps then ``--resume`` to ``steps``. Returns the checkpoints (tensors, state) of the straight run's end,
    of the resumed run's end and of the interrupted run at ``stop``."""
    from deepmetric.training import train

    def config(n):
        return tiny_config(**{**sections, "train": {**sections.get("train", {}), "steps": n, "checkpoint_every": stop}})

    train(config(steps), root / "straight", progress=False)
    train(config(stop), root / "resumed", progress=False)
    interrupted = checkpoint(root / "resumed/checkpoints/last.safetensors")
    train(config(steps), root / "resumed", resume=True, progress=False)
    return (checkpoint(root / "straight/checkpoints/last.safetensors"),
            checkpoint(root / "resumed/checkpoints/last.safetensors"), interrupted)


def assert_resumed_exactly(straight, resumed, steps: int) -> None:
    """The two checkpoints are the same: their whole JSON state (step, optimiser hyper-parameters, the model's spec,
    the best validation score and its step, the generator's state) is equal, and every tensor is bit-identical: the
    model, the optimiser (moments, step counts), the objective's and the generator's parameters and optimisers, the
    generator's noise stream. torch's global stream (``rng.torch``) is left out: the data loader draws its base seed
    from it when a run (re)starts."""
    (a, a_state), (b, b_state) = straight, resumed
    assert a_state["step"] == b_state["step"] == steps
    differing = sorted(k for k in a_state.keys() | b_state.keys() if a_state.get(k) != b_state.get(k))
    assert not differing, "checkpoint state differs after resuming: " + "; ".join(
        f"{k}: {a_state.get(k)!r} (uninterrupted) != {b_state.get(k)!r} (resumed)" for k in differing)
    assert a.keys() == b.keys()
    assert any(k.startswith("model.") for k in a) and any(k.startswith("optim.") for k in a)
    different = [k for k in a if k != "rng.torch" and not torch.equal(a[k], b[k])]
    assert not different, f"differ after resuming: {different[:8]}"


def assert_trained_metrics_are_evaluates(run_dir, capsys) -> dict:
    """The test metrics ``train`` wrote (``RUN/metrics.json``) are finite and in [0, 1], and equal what
    ``deepmetric evaluate RUN --json`` recomputes from the checkpoint; returns them."""
    import json
    import math

    from deepmetric.cli import main

    capsys.readouterr()
    record = json.loads((run_dir / "metrics.json").read_text())["metrics"]
    assert {"recall@1", "map@r", "r_precision"} <= set(record)
    assert all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in record.values() if v is not None), record
    assert main(["evaluate", str(run_dir), "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out) == record
    return record


def load_tool(name: str) -> ModuleType:
    """The script ``tools/<name>.py`` as a module (the tools are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[1] / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def waits_announced() -> Iterator[threading.Event]:
    """An event set once deepmetric's log says that a process waits for another's build or download ("another
    process is fetching it"), listening while the block runs."""
    waiting = threading.Event()

    class Announced(logging.Handler):
        def emit(self, record):
            if "another process is fetching it" in record.getMessage():
                waiting.set()

    handler = Announced()
    logging.getLogger("deepmetric").addHandler(handler)
    try:
        yield waiting
    finally:
        logging.getLogger("deepmetric").removeHandler(handler)


def twice_at_once(call, timeout: float) -> tuple[list, list]:
    """``call()`` in two threads started together, each joined for up to ``timeout`` seconds: the results and the
    errors."""
    results, errors = [], []

    def run():
        try:
            results.append(call())
        except Exception as error:  # noqa: BLE001 (returned)
            errors.append(error)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    return results, errors


def loaded_twice_at_once(monkeypatch, module, builder: str, load, build=None) -> tuple[list, list, int, bool]:
    """Call ``load()`` in two threads at once, as two trainings started together load a data set that is not built
    yet. ``module.<builder>`` (run as ``build`` when given) is held until the second thread says that it waits for
    the first one's lock (without a lock: until 10 s have passed, and then both build). Returns the results, the
    errors, how many builds ran and whether the second thread said it waits."""
    real, builds = build or getattr(module, builder), []
    with waits_announced() as waiting:

        def held(*args, **kwargs):
            builds.append(threading.current_thread().name)
            waiting.wait(10.0)
            return real(*args, **kwargs)

        monkeypatch.setattr(module, builder, held)
        results, errors = twice_at_once(load, 60.0)
    return results, errors, len(builds), waiting.is_set()


def reads_made_by_deepmetric(monkeypatch, run) -> int:
    """How many tensor values deepmetric's own code reads on the host (``item``, ``float(t)``, ``bool(t)``...) while
    ``run()`` runs: on a GPU each such read waits for everything queued before it. Reads made inside torch (Adam's
    step counter, a CPU tensor on every device) are not counted."""
    import inspect

    import deepmetric

    package, count = str(Path(deepmetric.__file__).resolve().parent), 0

    def counting(original):
        def read(tensor, *args, **kwargs):
            nonlocal count
            caller = inspect.currentframe().f_back.f_code.co_filename  # type: ignore[union-attr]
            count += str(Path(caller).resolve()).startswith(package)
            return original(tensor, *args, **kwargs)
        return read

    with monkeypatch.context() as patched:
        for name in ("item", "tolist", "__float__", "__int__", "__bool__", "__index__"):
            patched.setattr(torch.Tensor, name, counting(getattr(torch.Tensor, name)))
        run()
    return count
