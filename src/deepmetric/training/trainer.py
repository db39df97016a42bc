"""The training loop: P x K batches -> model -> objective -> Adam, with validation, checkpoints and logs.

Linear on purpose (after torchvision's reference scripts). The loop knows nothing about the head,
loss or regularisers: it calls ``objective(model(images), labels)``. Batches and augmentations are
pure functions of the seed and the step, and ``last`` holds the model, optimiser and RNG state, so a
run resumed from ``last`` ends with exactly the weights of an uninterrupted run. Under torch.distributed
(``--nproc N`` or torchrun) every rank trains on its slice of the same global batch and the objective
sees the whole batch (``distributed.py``); rank 0 alone writes the run directory. An example generator
(``generator.name``, ``deepmetric.generators``) is called generically: its rows join the metric loss, its own
step follows the model's, its state goes into ``last``; without one the loop is the plain one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..config import RunConfig, save_config
from ..config.validate import SELECT_BY
from ..data import PKSampler, TestTransform, TrainTransform, check_data_path
from ..data.batched_transforms import BatchedTrainTransform
from ..data.cache import CachedBatches, ImageCache
from ..data.table import RetrievalTable
from ..data.torch_dataset import ImageDataset, inference_loader, training_loader
from ..devices import resolve_device
from ..distributed import DistContext, context_from_env, gather_labels, gather_output, sum_gradients
from ..errors import DeepMetricError, TrainingError, TrainingInterrupted
from ..evaluation import EmbedSettings, evaluate
from ..generators import Generator, build_generator
from ..io import atomic_write_text, load_json, optimizer_from_flat, optimizer_to_flat, prefixed, to_json, unprefixed
from ..losses import Objective, build_objective, check_objective
from ..models import Embedder
from ..models.backbones import check_backbone_exists
from ..progress import progress_bar
from ..provenance import environment
from ..runs.checkpoint import load_checkpoint, save_checkpoint
from ..runs.folder import RunDir
from ..runs.table import load_table
from .compiled import training_forward
from .optim import apply_schedule, build_optimizer
from .scalars import TensorBoardScalars
from .setup import build_model, seed_everything, untrained_baseline
from .signals import stop_on_signals

log = logging.getLogger("deepmetric")


@dataclass
class TrainResult:
    run_dir: Path
    steps: int
    best_step: int | None
    best_score: float | None
    """The selected checkpoint's validation figure named by ``train.select_by``."""
    seconds: float
    start_step: int = 0
    """The step this session started from (0, or the checkpoint's step when resumed)."""
    stopped_early: int | None = None
    """The step ``train.patience`` stopped at (then ``steps`` is that step), else None."""
    best_val: dict[str, float] | None = None
    """The selected checkpoint's validation figures (Recall@1, MAP@R, R-precision), else None."""
    backbone_val: dict[str, float] | None = None
    """The untrained backbone's validation figures (``eval.baseline`` with a validation split), else None."""
    beats_backbone: bool | None = None
    """Whether the selected checkpoint ranks above the untrained backbone on validation (``selection_key``)."""


def _check_finite(loss: torch.Tensor, terms: dict[str, torch.Tensor], step: int, run: RunDir,
                  every_term: bool = False) -> None:
    """Stop on a NaN/Inf loss (or, with ``every_term``, any term), naming the step and the first non-finite term;
    ``last`` stays the last good one."""
    if torch.isfinite(loss) and not (every_term and not all(torch.isfinite(v) for v in terms.values())):
        return
    bad = next((name for name, value in terms.items() if not torch.isfinite(value)), "total")
    value = float(terms.get(bad, loss).detach())
    where = f"the last good checkpoint is {run.last}" if run.last.is_file() else "no checkpoint was written yet"
    raise TrainingError(f"step {step}: the loss term '{bad}' is {value}; training stopped ({where}).")


CONSTANT_LOSS_STEPS = 50
"""After this many consecutive steps at exactly the same training loss, the trainer warns once."""


class ConstantLoss:
    """Watch for a training loss that stays *exactly* the same step after step: no gradient reaches the model
    (margins every pair satisfies, a term zeroed by a NaN option). ``update`` returns ``(first, last)`` step of the
    run once it reaches ``steps`` equal values, and only that once per training."""

    def __init__(self, steps: int):
        self.steps, self.value, self.first, self.said = steps, None, 0, False

    def update(self, step: int, value: float) -> tuple[int, int] | None:
        if value != self.value:
            self.value, self.first = value, step
            return None
        if self.said or step - self.first + 1 < self.steps:
            return None
        self.said = True
        return self.first, step


def _training_sample(config: RunConfig, train_part: RetrievalTable,
                     count: int) -> tuple[RetrievalTable, torch.utils.data.DataLoader]:
    """A seeded sample of ``count`` training rows (in row order) and a loader of them with the test transform."""
    rows = np.sort(np.random.default_rng(config.train.seed).permutation(len(train_part))[:count])
    part = train_part.subset(rows)
    dataset = ImageDataset(part, TestTransform(config.data.image_size, config.data.test_resize))
    return part, inference_loader(dataset, config.eval.batch_size, config.data.num_workers)


def initialize_head(model: Embedder, config: RunConfig, train_part: RetrievalTable, device: torch.device) -> None:
    """Give the head the training images it asks for (``Head.init_images``): a seeded sample, test transform."""
    count = min(model.head.init_images, len(train_part))
    if count <= 0:
        return
    _, loader = _training_sample(config, train_part, count)
    log.info("initialising the %s head from %d training images", config.model.head, count)
    model.initialize_head(images.to(device) for images, _, _ in loader)


@dataclass
class Session:
    """What one training session works with: the steps of ``train`` hand it on instead of long argument lists."""

    config: RunConfig
    run: RunDir
    context: DistContext
    device: torch.device
    progress: bool
    model: Embedder
    table: RetrievalTable
    train_part: RetrievalTable
    classes: np.ndarray
    """The training classes, sorted; batches carry their indices (per-class loss parameters index by these)."""
    objective: Objective
    optimizer: torch.optim.Optimizer
    generator: Generator | None = None
    sampler: PKSampler | None = None
    start_step: int = 0
    best: dict[str, Any] = field(default_factory=lambda: {"score": None, "step": None})
    stopped_early: int | None = None
    """The step at which ``train.patience`` stopped the run (kept in ``last``), else None."""
    backbone_val: dict[str, float] | None = None
    """The untrained backbone's validation figures (``eval.baseline`` with a validation split)."""
    scalars: TensorBoardScalars | None = None
    """TensorBoard's view of the log (``train.tensorboard``), on rank 0."""
    cache: ImageCache | None = None
    """The training split decoded once (``data.cache``)."""


def selection_key(metrics: dict[str, float], by: str = "recall@1") -> list[float]:
    """How validation ranks checkpoints (``train.select_by``): Recall@1, ties (it saturates on small validation
    sets) broken by MAP@R, then R-precision; or MAP@R first, then Recall@1 and R-precision."""
    first, second = ("map@r", "recall@1") if by == "map@r" else ("recall@1", "map@r")
    return [metrics[first], metrics[second], metrics["r_precision"]]


def _improves(key: list[float], best: dict[str, Any]) -> bool:
    if best.get("score") is None:
        return True
    held = best.get("key") or [best["score"], float("-inf"), float("-inf")]  # a checkpoint from before the tie rule
    return key > held


def _save_last(session: Session, step: int) -> None:
    model, objective, optimizer, generator = session.model, session.objective, session.optimizer, session.generator
    optim_tensors, optim_meta = optimizer_to_flat(optimizer)
    tensors = {**prefixed("model", model.state_dict()), **prefixed("objective", objective.state_dict()),
               **prefixed("optim", optim_tensors), "rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors.update({f"rng.cuda.{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    state = {"kind": "last", "step": step, "model_spec": model.spec, "objective_classes": objective.num_classes,
             "optimizer": optim_meta, "best": session.best, "stopped_early": session.stopped_early}
    if generator is not None:
        generator_tensors, state["generator"] = generator.checkpoint_state()
        tensors.update(prefixed("generator", generator_tensors))
    memory_tensors, memory_state = objective.checkpoint_state()  # a cross-batch memory (loss.memory), if any
    if memory_state is not None:
        tensors.update(prefixed("memory", memory_tensors))
        state["memory"] = memory_state
    save_checkpoint(session.run.last, tensors, state)


def _save_best(session: Session, step: int, metrics: dict[str, float]) -> None:
    """The model at its best validation score, with the objective's state (for evaluating auxiliary embeddings)."""
    model, objective = session.model, session.objective
    tensors = {**prefixed("model", model.state_dict()), **prefixed("objective", objective.state_dict())}
    save_checkpoint(session.run.best, tensors, {"kind": "best", "step": step, "model_spec": model.spec,
                                                "objective_classes": objective.num_classes,
                                                "val_recall@1": metrics["recall@1"], "val_map@r": metrics["map@r"],
                                                "val_r_precision": metrics["r_precision"]})


def _validate(session: Session, step: int, bar: Any | None) -> None:
    """Evaluate the validation split (sharded across ranks), log it, and save ``best`` (with the objective's
    state, for evaluating auxiliary embeddings) when it improves by ``selection_key``; every rank updates
    ``session.best`` alike."""
    config, context = session.config, session.context
    metrics = evaluate(session.model, session.table, "val", EmbedSettings.from_config(config, session.device, False),
                       (1,), nmi=False, engine=config.eval.engine, context=context)
    by = config.train.select_by
    key = selection_key(metrics, by)
    improved = _improves(key, session.best)
    if improved:
        session.best = {"score": metrics[by], "step": step, "key": key,
                        "metrics": {m: metrics[m] for m in ("recall@1", "map@r", "r_precision")}}
    if context.is_main:
        session.run.append_log({"step": step, "split": "val", **metrics})
        if session.scalars is not None:
            session.scalars.validation(step, metrics)
        if improved:
            _save_best(session, step, metrics)
    if bar is not None:
        best = session.best
        line = (f"step {step}: validation Recall@1 {metrics['recall@1']:.4f}, MAP@R {metrics['map@r']:.4f} "
                f"(best {SELECT_BY[config.train.select_by]} {best['score']:.4f} at step {best['step']})")
        stream = getattr(bar, "fp", None)  # a bar tqdm disabled (TQDM_DISABLE) has none
        if stream is None:
            log.info("%s", line)
        else:  # on the bar's own stream (standard error): tqdm.write's default is standard output
            bar.write(line, file=stream)


def _resume(session: Session) -> None:
    """Load ``last`` into the session: model, objective (its cross-batch memory too), optimiser, generator, RNG, step
    and best."""
    run, generator = session.run, session.generator
    tensors, state = load_checkpoint(run.last)
    if generator is not None:
        if "generator" not in state:
            raise DeepMetricError(f"cannot resume {run.path} with a generator: its checkpoint has none (add the "
                                  "generator to a new run instead)")
        generator.load_checkpoint_state(unprefixed("generator", tensors), state["generator"])
    session.model.load_state_dict(unprefixed("model", tensors))
    session.objective.load_state_dict(unprefixed("objective", tensors))
    session.objective.load_checkpoint_state(unprefixed("memory", tensors), state.get("memory"))
    optimizer_from_flat(session.optimizer, unprefixed("optim", tensors), state["optimizer"])
    torch.set_rng_state(tensors["rng.torch"])
    cuda_states = [tensors[k] for k in sorted(k for k in tensors if k.startswith("rng.cuda."))]
    if cuda_states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda_states)
    session.start_step = int(state["step"])
    session.best = state.get("best", {}) or {"score": None, "step": None}
    stopped = state.get("stopped_early")
    session.stopped_early = stopped if isinstance(stopped, int) and session.config.train.patience else None


def _build_generator(config: RunConfig, model: Embedder, num_classes: int,
                     context: DistContext) -> Generator | None:
    """The run's example generator (``generator.name``), or None: the plain pipeline."""
    if config.generator.name is None:
        return None
    if context.enabled:
        raise DeepMetricError("example generators (generator.name) run in one process; drop --nproc/torchrun")
    batch_size = config.data.classes_per_batch * config.data.samples_per_class
    return build_generator(config.generator.name, config.generator.options, head=model.head,
                           num_classes=num_classes, batch_size=batch_size, lr=config.train.lr, seed=config.train.seed)


def _generator_diagnostics(run: RunDir, config: RunConfig, model: Embedder, generator: Generator,
                           train_part: RetrievalTable, classes: np.ndarray, device: torch.device) -> None:
    """Embed a seeded sample of training images (test transform) and let the generator draw its diagnostics;
    the summary goes to ``RUN/generator.json``."""
    count = min(generator.diagnostic_images, len(train_part))
    embeddings, labels = torch.zeros(0, model.embedding_dim), np.zeros(0, dtype=np.int64)
    if count > 0:
        part, loader = _training_sample(config, train_part, count)
        embeddings = torch.cat([model.embed(images.to(device)).cpu() for images, _, _ in loader])
        labels = np.searchsorted(classes, part.labels)
    summary = generator.write_diagnostics(run.path, embeddings, labels, [str(c) for c in classes])
    atomic_write_text(run.path / "generator.json", to_json(summary, indent=2))
    log.info("generator diagnostics: %s", summary)


def _prepare_run_dir(run: RunDir, resume: bool, context: DistContext, config: RunConfig) -> None:
    """A run folder holds a run once it has a checkpoint; one that stopped before its first (a failed start)
    starts afresh, and ``--resume`` needs a checkpoint whose model, objective and groups the config keeps."""
    if run.last.is_file() and not resume:
        raise DeepMetricError(f"{run.path} already holds a run; pass --resume to continue it or choose another --out")
    if resume and not run.last.is_file():
        raise DeepMetricError(f"cannot resume {run.path}: it holds no checkpoint (the run stopped before its first); "
                              "start it again without --resume")
    if resume:
        run.check_resumable(config)
    elif run.exists() and context.is_main:
        log.warning("%s holds a run that stopped before its first checkpoint: starting it afresh", run.path)
        run.clear_failed_start()
    if context.is_main:
        run.remove_stale_temporaries()
    context.barrier()  # every rank has looked before rank 0 writes


def _set_up_process(t: Any, context: DistContext) -> torch.device:
    """Threads, determinism and seeds of this process; its device."""
    if t.threads:
        torch.set_num_threads(t.threads)
    if t.deterministic:
        # cuBLAS is deterministic only with a fixed workspace, read when its first handle is made in the process
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    seed_everything(t.seed)
    return resolve_device(t.device, context.local_rank)


def _build_session(config: RunConfig, run: RunDir, context: DistContext, device: torch.device, resume: bool,
                   progress: bool) -> tuple[Session, list[Any]]:
    """Everything training needs, each piece checked before anything is written: the model first (a missing or
    misfitting weight file is found before minutes of image audit), then the data and its audit, the
    objective, optimiser and generator, the state of ``last`` when resuming, and the sampler (a data set too small
    for a P x K batch is refused here). Returns the session and the bad items the audit left out."""
    model = build_model(config).to(device)
    check_objective(config.loss, model.head)  # a loss that fails on its options, before minutes of image audit
    table, bad_items = load_table(config, progress)
    train_part = table.split("train")
    classes = np.unique(train_part.labels)
    if context.is_main:
        log.info("%s", table.summary())
    if context.enabled and not config.model.freeze_bn:
        log.warning("distributed training with model.freeze_bn=false: BatchNorm statistics come from each "
                    "rank's slice, so results differ from one process")
    if not resume:
        initialize_head(model, config, train_part, device)
    generator = _build_generator(config, model, len(classes), context)
    extra_classes = generator.extra_classes if generator is not None else 0
    objective = build_objective(config.loss, model.head, num_classes=len(classes) + extra_classes).to(device)
    optimizer = build_optimizer(model, objective, config.train)
    if generator is not None:
        generator.to(device)
    session = Session(config, run, context, device, progress, model, table, train_part, classes, objective,
                      optimizer, generator)
    if resume:
        _resume(session)
    t, d = config.train, config.data
    session.sampler = PKSampler(np.searchsorted(classes, train_part.labels), d.classes_per_batch,
                                d.samples_per_class, seed=t.seed, start_step=session.start_step, num_steps=t.steps,
                                rank=context.rank, world_size=context.world_size)
    if len(session.sampler.dropped_classes) and context.is_main:
        log.warning("%d training classes with a single image are left out of the batches",
                    len(session.sampler.dropped_classes))
    if d.cache:  # decoded here, so that a cache that would not fit is refused before anything is written
        session.cache = ImageCache.build(train_part, d.image_size, d.resize_range, d.train_pad, device, progress)
    return session, bad_items


def _first_writes(session: Session, bad_items: list[Any]) -> None:
    """What rank 0 writes once every check has passed: the bad items left out, the config, this session's
    environment, the untrained baseline; a resumed run's log loses the steps after its checkpoint."""
    config, run, context = session.config, session.run, session.context
    if context.is_main:
        if session.start_step:  # (the step it resumes from is said once, with the run directory)
            run.truncate_log(session.start_step)  # a killed run may have logged steps after its last checkpoint
        if bad_items:
            atomic_write_text(run.bad_items, "".join(f"{item.line()}\n" for item in bad_items))
            log.warning("left out %d bad item(s); the list is in %s", len(bad_items), run.bad_items)
        save_config(config, run.config_path)
        run.add_session(environment(session.device, start_step=session.start_step, steps=config.train.steps,
                                    processes=context.world_size))
        if config.train.tensorboard:
            session.scalars = TensorBoardScalars(run.path / "tensorboard", session.start_step)
        if config.eval.baseline and not run.baseline.is_file():
            log.info("evaluating the untrained backbone on the test split")
            baseline = untrained_baseline(config, session.table, session.device, session.progress)
            atomic_write_text(run.baseline, to_json(baseline, indent=2))
        if config.eval.baseline and session.table.count("val") > 0:
            session.backbone_val = _backbone_on_validation(session)
    context.barrier()


def _backbone_on_validation(session: Session) -> dict[str, float]:
    """The untrained backbone's validation figures, kept in ``baseline-val.json`` (evaluated once a run)."""
    run = session.run
    try:
        return dict(load_json(run.baseline_val.read_bytes())["metrics"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        pass
    log.info("evaluating the untrained backbone on the validation split")
    baseline = untrained_baseline(session.config, session.table, session.device, False, split="val")
    atomic_write_text(run.baseline_val, to_json(baseline, indent=2))
    return dict(baseline["metrics"])


def beats_backbone(best: dict[str, Any], backbone: dict[str, float] | None, by: str = "recall@1") -> bool | None:
    """Whether the selected checkpoint's validation figures rank above the untrained backbone's by
    ``selection_key``; None when either is unknown."""
    if backbone is None or best.get("key") is None:
        return None
    return list(best["key"]) > selection_key(backbone, by)


def _stop_requested(stop_signum: int | None, context: DistContext) -> int | None:
    """The signal to stop on, agreed by all ranks (a signal may reach them at different steps)."""
    if not context.enabled:
        return stop_signum
    flag = torch.tensor([stop_signum or 0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag) or None


def train(config: RunConfig, out: str | Path, resume: bool = False, progress: bool = True) -> TrainResult:
    """Train ``config`` into run directory ``out`` (resuming from its ``last`` checkpoint if asked).

    Rank 0 holds the run folder for the whole run (``RunDir.claimed``: a second training into it is refused);
    then the steps: set up the process, build and check every piece (``_build_session``), the first writes,
    the loop. A data path that does not exist, or a timm model that timm does not know, is refused first, before the
    run folder, the weights or the model.
    """
    check_data_path(config.data.spec)
    check_backbone_exists(config.model.backbone)  # timm:<name> too: an unknown model makes no run folder
    context = context_from_env()
    run = RunDir(out)
    with run.claimed() if context.is_main else contextlib.nullcontext():
        _prepare_run_dir(run, resume, context, config)
        device = _set_up_process(config.train, context)
        session, bad_items = _build_session(config, run, context, device, resume, progress and context.is_main)
        if context.is_main:  # before the first step: the folder to watch (its log, TensorBoard) while it trains
            log.info("run directory %s%s", run.path, f" (resuming after step {session.start_step})" if resume else "")
        _first_writes(session, bad_items)
        try:
            return _loop(session)
        finally:
            if session.scalars is not None:
                session.scalars.close()


def _loop(session: Session) -> TrainResult:
    """The training loop, from ``session.start_step`` to ``train.steps``: batch, forward, objective, step; logs,
    validation, checkpoints; a signal stops it after a checkpoint."""
    config, run, context, device = session.config, session.run, session.context, session.device
    model, objective, optimizer, generator = session.model, session.objective, session.optimizer, session.generator
    t, progress, start_step = config.train, session.progress, session.start_step
    has_val = session.table.count("val") > 0
    trained = model
    if context.enabled:
        trained = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.index
                                                            is not None else None)
        trained.register_comm_hook(None, sum_gradients)
    forward = training_forward(trained, t.compile)
    d = config.data
    labels = np.searchsorted(session.classes, session.train_part.labels)
    if session.cache is not None:  # data.cache: augmented on the device, yields what the loader yields
        augment = BatchedTrainTransform(d.image_size, d.resize_range, d.flip, d.train_pad)
        batches = iter(CachedBatches(session.cache, session.sampler, labels, augment, device))
    else:
        dataset = ImageDataset(session.train_part, TrainTransform(d.image_size, d.resize_range, d.flip, d.train_pad),
                               labels=labels)
        batches = iter(training_loader(dataset, session.sampler, d.num_workers, d.pin_memory, device))
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=t.amp)

    started = time.perf_counter()
    window_start, window_images, smoothed = time.perf_counter(), 0, None
    constant = ConstantLoss(CONSTANT_LOSS_STEPS)
    bar = progress_bar(total=t.steps, initial=start_step, desc="training", unit="step", disable=not progress,
                       dynamic_ncols=True)
    model.train()
    end = start_step if session.stopped_early is not None else t.steps
    if session.stopped_early is not None and start_step < t.steps:
        log.info("train.patience stopped this run at step %d; nothing to train (train.patience=0 goes on)",
                 start_step)
    with stop_on_signals() as stop:
        for step in range(start_step, end):
            images, labels, _ = next(batches)
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            apply_schedule(optimizer, t.lr_schedule, step, t.steps, t.lr_milestones, t.lr_gamma)
            objective.set_step(step)
            with autocast:
                output = forward(images)
            if t.amp:
                output = output.float()  # the objective computes in float32 (HeadOutput.float)
            if context.enabled:  # the objective sees the whole global batch, on every rank
                output, labels = gather_output(output, len(images)), gather_labels(labels)
            generated = generator.generate(output, labels) if generator is not None else None
            loss, terms = objective(output, labels, generated.rows() if generated is not None else None)
            _check_finite(loss, terms, step + 1, run)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if generator is not None:
                terms.update(generator.step(output, labels))
                _check_finite(loss, terms, step + 1, run, every_term=True)
            done = step + 1
            window_images += len(labels)
            value = float(loss.detach())
            smoothed = value if smoothed is None else 0.9 * smoothed + 0.1 * value
            flat = constant.update(done, value)
            if flat is not None and context.is_main:
                log.warning("the training loss has been exactly %g for %d steps (steps %d-%d): nothing is learning; "
                            "check loss.options (a margin every pair already satisfies?) and the learning rates",
                            value, flat[1] - flat[0] + 1, *flat)
            if context.is_main and (done % t.log_every == 0 or done == t.steps):
                rate = window_images / max(time.perf_counter() - window_start, 1e-9)
                record = {"step": done, "loss": value, **{k: float(v.detach()) for k, v in terms.items()},
                          "lr": optimizer.param_groups[0]["lr"], "images_per_s": rate}
                run.append_log(record)
                if session.scalars is not None:
                    session.scalars.training(record, optimizer)
                bar.set_postfix(loss=f"{smoothed:.4f}", img_s=f"{rate:.0f}", refresh=False)
                window_start, window_images = time.perf_counter(), 0
            bar.update(1)
            if has_val and (done % t.eval_every == 0 or done == t.steps):
                _validate(session, done, bar if progress else None)
                window_start = time.perf_counter()  # keep validation time out of the images/s figure
                if _out_of_patience(session, done):
                    session.stopped_early = done
            signum = _stop_requested(stop.signum, context)
            if context.is_main and (done % t.checkpoint_every == 0 or done == t.steps or signum
                                    or session.stopped_early):
                _save_last(session, done)
            if session.stopped_early:
                end = done
                log.info("train.patience: %d validations without a better one (best at step %s); stopped at step "
                         "%d of %d", t.patience, session.best["step"], done, t.steps)
                break
            if signum:
                bar.close()
                context.barrier()
                raise TrainingInterrupted(signum, f"{signal.Signals(signum).name} received: stopped after step {done}, "
                                          f"checkpoint written to {run.last}; continue with --resume")
    bar.close()
    if context.is_main and start_step >= t.steps and not run.last.is_file():
        _save_last(session, start_step)
    if generator is not None and context.is_main:
        _generator_diagnostics(run, config, model, generator, session.train_part, session.classes, device)
    context.barrier()
    best = session.best
    return TrainResult(run.path, end, best["step"], best["score"], time.perf_counter() - started, start_step,
                       session.stopped_early, best.get("metrics"), session.backbone_val,
                       beats_backbone(best, session.backbone_val, t.select_by))


def _out_of_patience(session: Session, step: int) -> bool:
    """Whether ``train.patience`` validations in a row have passed since the best one."""
    t, best = session.config.train, session.best.get("step")
    return bool(t.patience) and best is not None and step - best >= t.patience * t.eval_every
