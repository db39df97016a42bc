"""The training loop: P x K batches -> model -> objective -> Adam, with validation, checkpoints and logs.

Linear on purpose (after torchvision's reference scripts). The loop knows nothing about the head,
loss or regularisers: it calls ``objective(model(images), labels)``. Batches and augmentations are
pure functions of the seed and the step, and ``last`` holds the model, optimiser and RNG state, so a
run resumed from ``last`` ends with exactly the weights of an uninterrupted run.
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from ..config import RunConfig, save_config
from ..data import PKSampler, TestTransform, TrainTransform, load_dataset
from ..data.table import RetrievalDataset
from ..data.torch_dataset import ImageDataset, inference_loader, training_loader
from ..errors import DeepMetricError
from ..evaluation import evaluate
from ..losses import Objective, build_objective
from ..models import Embedder, create_model
from .checkpoint import (
    atomic_write_text,
    load_checkpoint,
    optimizer_from_flat,
    optimizer_to_flat,
    prefixed,
    save_checkpoint,
    unprefixed,
)
from .optim import apply_schedule, build_optimizer
from .run_dir import RunDir

log = logging.getLogger("deepmetric")


class TrainingError(DeepMetricError):
    """Training cannot go on (e.g. a non-finite loss); the message names the step and the term."""


@dataclass
class TrainResult:
    run_dir: Path
    steps: int
    best_step: int | None
    best_score: float | None
    seconds: float


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise DeepMetricError(f"train.device={name} but torch sees no CUDA device")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def load_table(config: RunConfig) -> RetrievalDataset:
    d = config.data
    return load_dataset(d.spec, seed=d.seed, check_counts=d.check_counts, val_fraction=d.val_fraction,
                        val_seed=d.val_seed)


def build_model(config: RunConfig) -> Embedder:
    m = config.model
    model = create_model(backbone=m.backbone, head=m.head, embedding_dim=m.embedding_dim, pretrained=m.pretrained,
                         split=m.split, freeze_bn=m.freeze_bn, weights=m.weights, **m.head_options)
    return model.set_channels_last(config.train.channels_last)


def untrained_baseline(config: RunConfig, table: RetrievalDataset, device: torch.device,
                       progress: bool) -> dict[str, Any]:
    """Test metrics of the backbone's l2-normalised pooled features, before any training."""
    m = config.model
    model = create_model(backbone=m.backbone, head="gap", embedding_dim=0, pretrained=m.pretrained,
                         freeze_bn=m.freeze_bn, weights=m.weights)
    model = model.set_channels_last(config.train.channels_last).to(device)
    metrics = evaluate(model, table, "test", config.data.image_size, config.eval.recall_at, config.eval.nmi,
                       config.data.test_resize, config.eval.batch_size, device, config.data.num_workers, progress)
    pretrained = "ImageNet-pretrained" if m.pretrained else "randomly initialised"
    return {"model": f"{pretrained} {m.backbone}, pooled features, no training", "metrics": metrics}


def initialize_head(model: Embedder, config: RunConfig, train_part: RetrievalDataset, device: torch.device) -> None:
    """Give the head the training images it asks for (``Head.init_images``): a seeded sample, test transform."""
    count = min(int(getattr(model.head, "init_images", 0)), len(train_part))
    if count <= 0:
        return
    rows = np.sort(np.random.default_rng(config.train.seed).permutation(len(train_part))[:count])
    dataset = ImageDataset(train_part.subset(rows), TestTransform(config.data.image_size, config.data.test_resize))
    loader = inference_loader(dataset, config.eval.batch_size, config.data.num_workers)
    log.info("initialising the %s head from %d training images", config.model.head, count)
    model.initialize_head(images.to(device) for images, _, _ in loader)


def _save_last(run: RunDir, model: Embedder, objective: Objective, optimizer: torch.optim.Optimizer, step: int,
               best: dict[str, Any]) -> None:
    optim_tensors, optim_meta = optimizer_to_flat(optimizer)
    tensors = {**prefixed("model", model.state_dict()), **prefixed("objective", objective.state_dict()),
               **prefixed("optim", optim_tensors), "rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors.update({f"rng.cuda.{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    save_checkpoint(run.last, tensors, {"kind": "last", "step": step, "model_spec": model.spec,
                                        "optimizer": optim_meta, "best": best})


def _save_best(run: RunDir, model: Embedder, objective: Objective, step: int, score: float) -> None:
    """The model at its best validation score, with the objective's state (for evaluating auxiliary embeddings)."""
    tensors = {**prefixed("model", model.state_dict()), **prefixed("objective", objective.state_dict())}
    save_checkpoint(run.best, tensors, {"kind": "best", "step": step, "model_spec": model.spec, "val_recall@1": score})


def _validate(config: RunConfig, run: RunDir, model: Embedder, objective: Objective, table: RetrievalDataset,
              device: torch.device, step: int, best: dict[str, Any], bar: tqdm | None) -> dict[str, Any]:
    """Evaluate the validation split, log it, and save ``best`` when Recall@1 improves; returns the new best."""
    metrics = evaluate(model, table, "val", config.data.image_size, (1,), nmi=False,
                       test_resize=config.data.test_resize, batch_size=config.eval.batch_size, device=device,
                       num_workers=config.data.num_workers, progress=False)
    score = metrics["recall@1"]
    run.append_log({"step": step, "split": "val", **metrics})
    if best["score"] is None or score > best["score"]:
        best = {"score": score, "step": step}
        _save_best(run, model, objective, step, score)
    if bar is not None:
        bar.write(f"step {step}: validation Recall@1 {score:.4f} (best {best['score']:.4f} at step {best['step']})")
    return best


def _resume(run: RunDir, model: Embedder, objective: Objective,
            optimizer: torch.optim.Optimizer) -> tuple[int, dict[str, Any]]:
    tensors, state = load_checkpoint(run.last)
    model.load_state_dict(unprefixed("model", tensors))
    objective.load_state_dict(unprefixed("objective", tensors))
    optimizer_from_flat(optimizer, unprefixed("optim", tensors), state["optimizer"])
    torch.set_rng_state(tensors["rng.torch"])
    cuda_states = [tensors[k] for k in sorted(k for k in tensors if k.startswith("rng.cuda."))]
    if cuda_states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda_states)
    return int(state["step"]), state.get("best", {})


def train(config: RunConfig, out: str | Path, resume: bool = False, progress: bool = True) -> TrainResult:
    """Train ``config`` into run directory ``out`` (resuming from its ``last`` checkpoint if asked)."""
    run = RunDir(out)
    if run.exists() and not resume:
        raise DeepMetricError(f"{run.path} already holds a run; pass --resume to continue it or choose another --out")
    if resume and not run.last.is_file():
        raise DeepMetricError(f"cannot resume: {run.last} does not exist")
    t = config.train
    if t.threads:
        torch.set_num_threads(t.threads)
    if t.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    seed_everything(t.seed)
    device = resolve_device(t.device)

    table = load_table(config)
    train_part = table.split("train")
    has_val = table.count("val") > 0
    classes = np.unique(train_part.labels)
    contiguous = np.searchsorted(classes, train_part.labels)  # per-class loss parameters index by these
    log.info("%s", table.summary())

    model = build_model(config).to(device)
    if not resume:
        initialize_head(model, config, train_part, device)
    objective = build_objective(config.loss, model.head, num_classes=len(classes)).to(device)
    optimizer = build_optimizer(model, objective, t)
    run.path.mkdir(parents=True, exist_ok=True)
    start_step, best = 0, {"score": None, "step": None}
    if resume:
        start_step, best = _resume(run, model, objective, optimizer)
        log.info("resuming %s from step %d", run.path, start_step)
    save_config(config, run.config_path)

    if config.eval.baseline and not run.baseline.is_file():
        log.info("evaluating the untrained backbone on the test split")
        baseline = untrained_baseline(config, table, device, progress)
        atomic_write_text(run.baseline, json.dumps(baseline, indent=2))

    sampler = PKSampler(contiguous, config.data.classes_per_batch, config.data.samples_per_class, seed=t.seed,
                        start_step=start_step, num_steps=t.steps)
    if len(sampler.dropped_classes):
        log.warning("%d training classes with a single image are left out of the batches",
                    len(sampler.dropped_classes))
    dataset = ImageDataset(train_part, TrainTransform(config.data.image_size, config.data.resize_range,
                                                      config.data.flip), labels=contiguous)
    batches = iter(training_loader(dataset, sampler, config.data.num_workers))

    started = time.perf_counter()
    window_start, window_images, smoothed = time.perf_counter(), 0, None
    bar = tqdm(total=t.steps, initial=start_step, desc="training", unit="step", disable=not progress,
               dynamic_ncols=True)
    model.train()
    for step in range(start_step, t.steps):
        images, labels, _ = next(batches)
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        apply_schedule(optimizer, t.lr_schedule, step, t.steps)
        loss, terms = objective(model(images), labels)
        if not torch.isfinite(loss):
            bad = next((name for name, value in terms.items() if not torch.isfinite(value)), "total")
            raise TrainingError(f"step {step + 1}: the loss term '{bad}' is {float(terms.get(bad, loss).detach())}; "
                                f"training stopped. The last good checkpoint is {run.last} (if any was written).")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        done = step + 1
        window_images += len(images)
        value = float(loss.detach())
        smoothed = value if smoothed is None else 0.9 * smoothed + 0.1 * value
        if done % t.log_every == 0 or done == t.steps:
            elapsed = time.perf_counter() - window_start
            rate = window_images / max(elapsed, 1e-9)
            run.append_log({"step": done, "loss": value, **{k: float(v.detach()) for k, v in terms.items()},
                            "lr": optimizer.param_groups[0]["lr"], "images_per_s": rate})
            bar.set_postfix(loss=f"{smoothed:.4f}", img_s=f"{rate:.0f}")
            window_start, window_images = time.perf_counter(), 0
        bar.update(1)
        if has_val and (done % t.eval_every == 0 or done == t.steps):
            best = _validate(config, run, model, objective, table, device, done, best, bar if progress else None)
            window_start = time.perf_counter()  # keep validation time out of the images/s figure
        if done % t.checkpoint_every == 0 or done == t.steps:
            _save_last(run, model, objective, optimizer, done, best)
    bar.close()
    if start_step >= t.steps and not run.last.is_file():
        _save_last(run, model, objective, optimizer, start_step, best)
    return TrainResult(run.path, t.steps, best["step"], best["score"], time.perf_counter() - started)

