"""``train.compile`` (issue 52 item 1): the training forward through ``torch.compile`` gives the eager run's losses,
leaves checkpoints, resume and export as they were, and falls back to eager in one warning where compiling fails.
The tests compile with the ``aot_eager`` backend (dynamo and AOTAutograd trace the same graphs as inductor, without
the minutes of code generation a CPU needs); the GPU figures are in docs/benchmarks/training-step.md."""

from __future__ import annotations

import json
import logging

import pytest
import torch

import deepmetric.models.compiled as compiled
from deepmetric.training import train
from helpers import checkpoint, tiny_config, train_straight_and_resumed

pytestmark = pytest.mark.usefixtures("aot_eager_compile")


def losses(run):
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [record["loss"] for record in map(json.loads, lines) if "loss" in record]


@pytest.mark.parametrize("head", ["gap", "abe", "dgml"])
def test_a_compiled_run_trains_as_the_eager_one_and_its_checkpoint_is_the_plain_models(tmp_path, head, caplog):
    caplog.set_level(logging.WARNING, logger="deepmetric")
    options = {"head": head, **({"head_options": {"num_learners": 2}} if head == "abe" else {})}
    eager = tiny_config(model=options, train={"steps": 4, "log_every": 1})
    with_compile = tiny_config(model=options, train={"steps": 4, "log_every": 1, "compile": True})
    from torch._dynamo.utils import counters

    train(eager, tmp_path / "eager", progress=False)
    counters.clear()
    train(with_compile, tmp_path / "compiled", progress=False)
    assert "cannot be compiled" not in caplog.text and counters["stats"]["unique_graphs"] >= 1  # it did compile
    assert losses(tmp_path / "compiled") == pytest.approx(losses(tmp_path / "eager"), rel=1e-4, abs=1e-5)
    (a, _), (b, _) = (checkpoint(tmp_path / run / "checkpoints/last.safetensors") for run in ("eager", "compiled"))
    assert a.keys() == b.keys() and not any("_orig_mod" in key for key in b)  # the plain module's names
    for key in a:
        if key.startswith("model."):
            torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5)


def test_deml_compiles_no_more_after_its_first_step_around_its_host_side_crop_boxes(tmp_path, caplog):
    """DeML's object-attention box comes from connected components (SciPy's on the host, a propagation run until it
    settles on a GPU); traced, dynamo guarded on the maps' values and compiled again at every step until its
    recompile limit (an H100, 2026-11-27). The boxes are left out of the graph: a run of 6 steps compiles the graphs
    a run of 2 compiles, and the losses are the eager run's."""
    from torch._dynamo.utils import counters

    caplog.set_level(logging.WARNING, logger="deepmetric")
    options = {"head": "deml", "head_options": {"num_scales": 2, "num_branches": 2}}
    graphs = {}
    for steps in (2, 6):
        torch._dynamo.reset()
        counters.clear()
        config = tiny_config(model=options, train={"steps": steps, "log_every": 1, "compile": True})
        train(config, tmp_path / f"compiled-{steps}", progress=False)
        graphs[steps] = counters["stats"]["unique_graphs"]
    assert "cannot be compiled" not in caplog.text and graphs[2] >= 1 and graphs[6] == graphs[2]
    train(tiny_config(model=options, train={"steps": 6, "log_every": 1}), tmp_path / "eager", progress=False)
    assert losses(tmp_path / "compiled-6") == pytest.approx(losses(tmp_path / "eager"), rel=1e-4, abs=1e-5)


def test_a_compiled_run_resumes_and_may_resume_eagerly(tmp_path):
    straight, resumed, _ = train_straight_and_resumed(tmp_path, 4, 2, train={"compile": True})
    assert resumed[1]["step"] == straight[1]["step"] == 4
    for key in straight[0]:
        if key.startswith("model."):
            torch.testing.assert_close(straight[0][key], resumed[0][key], rtol=1e-4, atol=1e-5)
    config = tiny_config(train={"steps": 6, "checkpoint_every": 2, "compile": False})
    train(config, tmp_path / "resumed", resume=True, progress=False)  # the setting may change between sessions
    assert checkpoint(tmp_path / "resumed/checkpoints/last.safetensors")[1]["step"] == 6


def test_a_model_that_cannot_be_compiled_trains_eagerly_after_one_warning(tmp_path, monkeypatch, caplog):
    def failing_backend(graph, example_inputs):
        raise RuntimeError("no C++ compiler here")

    monkeypatch.setattr(compiled, "BACKEND", failing_backend)
    caplog.set_level(logging.WARNING, logger="deepmetric")
    train(tiny_config(train={"steps": 4, "log_every": 1, "compile": True}), tmp_path / "fallback", progress=False)
    train(tiny_config(train={"steps": 4, "log_every": 1}), tmp_path / "eager", progress=False)
    warnings = [r.getMessage() for r in caplog.records if "cannot be compiled" in r.getMessage()]
    assert len(warnings) == 1 and "no C++ compiler here" in warnings[0] and "training eagerly" in warnings[0]
    assert "\n" not in warnings[0]
    assert losses(tmp_path / "fallback") == losses(tmp_path / "eager")  # every step eager, the same run


def test_an_error_of_the_model_itself_is_not_taken_for_a_compile_failure():
    class Broken(torch.nn.Module):
        def forward(self, x):
            raise ValueError("a bug of the model")

    forward = compiled.CompiledForward(Broken())
    forward.compiled = Broken()  # as if compiled: the model's own error must surface, not switch to eager
    with pytest.raises(ValueError, match="a bug of the model"):
        forward(torch.zeros(1))
    assert forward.active


def test_fp16_compiles_and_trains_as_the_eager_fp16_run(tmp_path, caplog):
    """``train.amp=fp16`` with ``train.compile``: the forward pass is compiled under float16 autocast, the scaler
    works outside the compiled graph; the losses and the steps the scaler skipped are the eager run's."""
    from torch._dynamo.utils import counters

    caplog.set_level(logging.WARNING, logger="deepmetric")
    settings = {"steps": 10, "log_every": 1, "amp": "fp16"}
    train(tiny_config(train=settings), tmp_path / "eager", progress=False)
    counters.clear()
    train(tiny_config(train={**settings, "compile": True}), tmp_path / "compiled", progress=False)
    assert "cannot be compiled" not in caplog.text and counters["stats"]["unique_graphs"] >= 1
    logs = {}
    for run in ("eager", "compiled"):
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        logs[run] = [record for record in map(json.loads, lines) if "loss" in record]
    assert [r["skipped_steps"] for r in logs["compiled"]] == [r["skipped_steps"] for r in logs["eager"]]
    assert 0 < logs["eager"][-1]["skipped_steps"] < 10  # steps were both skipped and taken
    assert losses(tmp_path / "compiled") == pytest.approx(losses(tmp_path / "eager"), rel=1e-3, abs=1e-4)
