"""Every preset in ``configs/`` and every run of every study builds and trains one step.

Each preset's config resolves; its model (random weights, 64-px images), objective, optimiser groups and, where
it has one, example generator build; and one training step runs on a tiny random batch. A new preset is checked
by adding its file. Study runs that resolve to a model, objective and optimiser already stepped are not
stepped again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from deepmetric.config import RunConfig, build_config, load_yaml
from deepmetric.data import DATASETS
from deepmetric.generators import build_generator
from deepmetric.losses import build_objective
from deepmetric.studies import load_study
from deepmetric.training.optim import build_optimizer
from deepmetric.training.setup import build_model

CONFIGS = Path(__file__).parent.parent / "configs"
PRESETS = sorted(p for p in CONFIGS.rglob("*.yaml") if CONFIGS / "studies" not in p.parents)
STUDIES = sorted((CONFIGS / "studies").glob("*.yaml"))
# Random weights, small images and batches: what is checked is that the pieces fit, not what they learn.
SMALL = {"model": {"pretrained": False, "weights": None},
         "data": {"image_size": 64, "classes_per_batch": 3, "samples_per_class": 2}}
NUM_CLASSES = 5
_stepped: set[str] = set()


def _signature(config: RunConfig) -> str:
    """What decides the model, objective and optimiser groups (not the data, the schedule or the seed)."""
    plain = config.to_dict()
    return json.dumps({k: plain[k] for k in ("model", "loss", "generator")} | {"groups": plain["train"]["groups"]},
                      sort_keys=True)


def step_once(config: RunConfig) -> None:
    """Build the run's pieces as ``deepmetric train`` does and take one step on random images."""
    signature = _signature(config)
    if signature in _stepped:
        return
    torch.manual_seed(0)
    model = build_model(config)
    d = config.data
    generator = None
    if config.generator.name is not None:
        generator = build_generator(config.generator.name, config.generator.options, head=model.head,
                                    num_classes=NUM_CLASSES, batch_size=d.classes_per_batch * d.samples_per_class,
                                    lr=config.train.lr, seed=config.train.seed)
    extra = generator.extra_classes if generator is not None else 0
    objective = build_objective(config.loss, model.head, num_classes=NUM_CLASSES + extra)
    optimizer = build_optimizer(model, objective, config.train)
    labels = torch.arange(d.classes_per_batch).repeat_interleave(d.samples_per_class)
    model.train()
    output = model(torch.rand(len(labels), 3, d.image_size, d.image_size))
    generated = generator.generate(output, labels) if generator is not None else None
    loss, _ = objective(output, labels, generated.rows() if generated is not None else None)
    assert torch.isfinite(loss), f"loss {loss}"
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if generator is not None:
        generator.step(output, labels)
    _stepped.add(signature)


def test_the_presets_are_found():
    assert len(PRESETS) > 90 and len(STUDIES) > 10


@pytest.mark.parametrize("preset", PRESETS, ids=[str(p.relative_to(CONFIGS)) for p in PRESETS])
def test_every_preset_builds_and_steps(preset: Path):
    step_once(build_config(load_yaml(preset), SMALL))


@pytest.mark.parametrize("preset", PRESETS, ids=[str(p.relative_to(CONFIGS)) for p in PRESETS])
def test_a_preset_named_for_a_data_set_reads_that_data_set(preset: Path):
    """``cars-cropped-abe8.yaml`` must name ``cars-cropped:``: run without ``--data`` it trains on what it says."""
    named = [n for n in DATASETS if preset.stem.startswith(f"{n}-")]
    if named:
        loader = build_config(load_yaml(preset)).data.spec.partition(":")[0]
        assert loader == max(named, key=len), f"{preset.name} reads {loader}"


@pytest.mark.parametrize("study", STUDIES, ids=[p.name for p in STUDIES])
def test_every_study_run_builds_and_steps(study: Path):
    runs = load_study(study).runs()
    assert runs
    for run in runs:
        try:
            step_once(build_config(*run.layers, SMALL))
        except Exception as error:
            raise AssertionError(f"{study.name}, run {run.name}: {error}") from error
