"""``train.tensorboard``: the event files hold what ``metrics.jsonl`` logs, read back with TensorBoard's own reader."""

from __future__ import annotations

import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from deepmetric.config import build_config
from deepmetric.errors import ConfigError
from deepmetric.runs.folder import RunDir
from deepmetric.training import train
from helpers import tiny_config


def scalars(folder):
    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_the_event_files_hold_the_logs_scalars_and_a_resume_replaces_what_came_after_its_checkpoint(tmp_path):
    config = tiny_config(data={"val_fraction": 0.4}, loss={"name": "margin"},
                         train={"steps": 4, "eval_every": 2, "checkpoint_every": 2, "tensorboard": True})
    train(config, tmp_path / "run", progress=False)
    log = RunDir(tmp_path / "run").read_log()
    found = scalars(tmp_path / "run/tensorboard")
    training = [r for r in log if "loss" in r]
    assert found["loss/total"] == [(r["step"], pytest.approx(r["loss"])) for r in training]
    assert found["loss/metric"] == [(r["step"], pytest.approx(r["metric"])) for r in training]
    assert found["speed/images_per_s"] == [(r["step"], pytest.approx(r["images_per_s"])) for r in training]
    assert {"lr/new", "lr/pretrained", "lr/loss"} <= set(found)  # every optimiser group, margin's beta included
    assert [s for s, _ in found["lr/loss"]] == [1, 2, 3, 4]
    validation = [r for r in log if r.get("split") == "val"]
    assert found["val/recall@1"] == [(r["step"], pytest.approx(r["recall@1"])) for r in validation]
    assert found["val/map@r"] == [(r["step"], pytest.approx(r["map@r"])) for r in validation]

    more = tiny_config(data={"val_fraction": 0.4}, loss={"name": "margin"},
                       train={"steps": 6, "eval_every": 2, "checkpoint_every": 2, "tensorboard": True})
    train(more, tmp_path / "run", resume=True, progress=False)
    steps = [s for s, _ in scalars(tmp_path / "run/tensorboard")["loss/total"]]
    assert steps == [1, 2, 3, 4, 5, 6]  # one value a step, across both sessions


def test_without_tensorboard_the_setting_is_refused_with_the_install_command(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    with pytest.raises(ConfigError, match=r"tensorboard=true needs the tensorboard package.*deepmetric\[tensorboard\]"):
        build_config({"train": {"tensorboard": True}})
    build_config({"train": {"tensorboard": False}})
