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
import functools
import logging
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist

from ..config import RunConfig
from ..config.validate import SELECT_BY
from ..data import TrainTransform, check_data_path
from ..data.batched_transforms import BatchedTrainTransform
from ..data.cache import CachedBatches
from ..data.table import RetrievalTable
from ..data.torch_dataset import ImageDataset, training_loader, uint8_batches
from ..data.transforms import as_unit_float
from ..distributed import (
    DistContext,
    agreed,
    context_from_env,
    gather_labels,
    gather_output,
    on_main,
    same_on_every_rank,
    sum_gradients,
)
from ..errors import TrainingInterrupted
from ..evaluation import EmbedSettings, evaluate
from ..generators import Generator
from ..io.files import atomic_write_text
from ..io.strict import to_json
from ..models import Embedder
from ..models.backbones import check_backbone_exists
from ..progress import progress_bar
from ..runs.folder import RunDir
from .compiled import training_forward
from .monitor import CONSTANT_LOSS_STEPS, ConstantLoss, StepLog, check_finite, check_terms_finite, last_good
from .optim import apply_schedule
from .selection import beats_backbone, improves, out_of_patience, selection_key
from .session import (
    Session,
    build_session,
    first_writes,
    prepare_run_dir,
    set_up_process,
    training_sample,
)
from .signals import stop_on_signals
from .state import read_last, save_best, save_last

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


def _validate(session: Session, step: int, bar: Any | None) -> None:
    """Evaluate the validation split (sharded across ranks), log it, and save ``best`` (with the objective's
    state, for evaluating auxiliary embeddings) when it improves by ``selection_key``; every rank updates
    ``session.best`` alike."""
    config, context = session.config, session.context
    settings = EmbedSettings.from_config(config, session.device, False)
    metrics = cast(dict[str, float],  # nmi=False: every value is a float (NMI alone can be None)
                   evaluate(session.model, session.table, "val", settings, (1,), nmi=False, engine=config.eval.engine,
                            context=context))
    by = config.train.select_by
    key = selection_key(metrics, by)
    improved = improves(key, session.best)
    if improved:
        session.best = {"score": metrics[by], "step": step, "key": key,
                        "metrics": {m: metrics[m] for m in ("recall@1", "map@r", "r_precision")}}
    if context.is_main:
        session.run.append_log({"step": step, "split": "val", **metrics})
        if session.scalars is not None:
            session.scalars.validation(step, metrics)
        if improved:
            save_best(session, step, metrics)
    if bar is not None:
        best = session.best
        line = (f"step {step}: validation Recall@1 {metrics['recall@1']:.4f}, MAP@R {metrics['map@r']:.4f} "
                f"(best {SELECT_BY[config.train.select_by]} {best['score']:.4f} at step {best['step']})")
        stream = getattr(bar, "fp", None)  # a bar tqdm disabled (TQDM_DISABLE) has none
        if stream is None:
            log.info("%s", line)
        else:  # on the bar's own stream (standard error): tqdm.write's default is standard output
            bar.write(line, file=stream)


def _generator_diagnostics(run: RunDir, config: RunConfig, model: Embedder, generator: Generator,
                           train_part: RetrievalTable, classes: np.ndarray, device: torch.device) -> None:
    """Embed a seeded sample of training images (test transform) and let the generator draw its diagnostics;
    the summary goes to ``RUN/generator.json``."""
    count = min(generator.diagnostic_images, len(train_part))
    embeddings, labels = torch.zeros(0, model.embedding_dim), np.zeros(0, dtype=np.int64)
    if count > 0:
        part, loader = training_sample(config, train_part, count)
        embeddings = torch.cat([model.embed(images.to(device)).cpu() for images, _, _ in loader])
        labels = np.searchsorted(classes, part.labels)
    summary = generator.write_diagnostics(run.path, embeddings, labels, [str(c) for c in classes])
    atomic_write_text(run.path / "generator.json", to_json(summary, indent=2))
    log.info("generator diagnostics: %s", summary)


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
    run folder, the weights or the model. Under torch.distributed rank 0 alone reads and writes the run folder (the
    other ranks get ``last`` from it when resuming) and a step that fails on one rank stops every rank
    (``distributed.on_main``, ``agreed``); every rank must load the same data set.
    """
    context = context_from_env()

    def check() -> None:
        check_data_path(config.data.spec)
        check_backbone_exists(config.model.backbone)  # timm:<name> too: an unknown model makes no run folder

    agreed(context, check)
    run = RunDir(out)
    with _claimed(run, context):
        prepare_run_dir(run, resume, config, context)
        checkpoint = read_last(run, context) if resume else None  # (a collective: before any rank can fail alone)
        device = agreed(context, lambda: set_up_process(config.train, context))
        build = functools.partial(build_session, config, run, context, device, checkpoint, progress and context.is_main)
        del checkpoint  # loaded into the session by build: a large one is not kept for the whole run
        session, bad_items = agreed(context, build)
        del build
        if context.enabled:  # a machine whose copy of the data differs would train on other batches, silently
            same_on_every_rank(context, session.table.digest(), session.table.summary(), "the data set")
        if context.is_main:  # before the first step: the folder to watch (its log, TensorBoard) while it trains
            log.info("run directory %s%s", run.path, f" (resuming after step {session.start_step})" if resume else "")
        first_writes(session, bad_items)
        try:
            return _loop(session)
        finally:
            if session.scalars is not None:
                session.scalars.close()


@contextlib.contextmanager
def _claimed(run: RunDir, context: DistContext) -> Iterator[None]:
    """Rank 0 holds the run folder (``RunDir.claimed``) while the block runs; a folder another training holds stops
    every rank."""
    with contextlib.ExitStack() as stack:
        on_main(context, lambda: stack.enter_context(run.claimed()))
        yield


def _loop(session: Session) -> TrainResult:
    """The training loop, from ``session.start_step`` to ``train.steps``, one step after the other: batch, forward,
    objective, backward and step; then the step's log, validation, checkpoint; a signal stops it after a checkpoint."""
    config, run, context, device = session.config, session.run, session.context, session.device
    model, objective, optimizer, generator = session.model, session.objective, session.optimizer, session.generator
    t, start_step, precision = config.train, session.start_step, session.precision
    has_val = session.table.count("val") > 0
    forward = training_forward(_distributed(model, context, device), t.compile)
    batches = _batches(session)
    started, step_log, constant = time.perf_counter(), StepLog(), ConstantLoss(CONSTANT_LOSS_STEPS)
    bar = progress_bar(total=t.steps, initial=start_step, desc="training", unit="step", disable=not session.progress,
                       dynamic_ncols=True)
    model.train()
    end = start_step if session.stopped_early is not None else t.steps
    if session.stopped_early is not None and start_step < t.steps:
        log.info("train.patience stopped this run at step %d; nothing to train (train.patience=0 goes on)",
                 start_step)
    with stop_on_signals() as stop:
        for step in range(start_step, end):
            images, labels, _ = next(batches)
            images, labels = as_unit_float(images.to(device, non_blocking=True)), labels.to(device, non_blocking=True)
            apply_schedule(optimizer, t.lr_schedule, step, t.steps, t.lr_milestones, t.lr_gamma)
            objective.set_step(step)
            with precision.autocast():
                output = forward(images)
            output = precision.float32(output)  # the objective (and a generator) compute in float32
            if context.enabled:  # the objective sees the whole global batch, on every rank
                output, labels = gather_output(output, len(images)), gather_labels(labels)
            generated = generator.generate(output, labels) if generator is not None else None
            loss, terms = precision.objective(objective, output, labels,
                                              generated.rows() if generated is not None else None)
            value = check_finite(loss, terms, step + 1, run, amp=precision.mode)  # the step's one read
            optimizer.zero_grad(set_to_none=True)
            precision.backward_and_step(loss, optimizer, step + 1, lambda: last_good(run))  # fp16: may skip it
            if generator is not None:
                terms.update(generator.step(output, labels))
                check_terms_finite(terms, step + 1, run)
            done = step + 1

            step_log.step(len(labels), value)
            _warn_if_constant(constant, done, value, context)
            if context.is_main and (done % t.log_every == 0 or done == t.steps):
                _log_step(session, done, value, terms, step_log, bar)
            bar.update(1)
            if has_val and (done % t.eval_every == 0 or done == t.steps):
                _validate(session, done, bar if session.progress else None)
                step_log.restart(keep_images=True)  # validation time is left out of the images/s figure
                if out_of_patience(t.patience, t.eval_every, session.best.get("step"), done):
                    session.stopped_early = done
            signum = _stop_requested(stop.signum, context)
            if context.is_main and (done % t.checkpoint_every == 0 or done == t.steps or signum
                                    or session.stopped_early):
                save_last(session, done)
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
    return _finish(session, end, time.perf_counter() - started)


def _distributed(model: Embedder, context: DistContext, device: torch.device) -> torch.nn.Module:
    """The model the loop trains: under torch.distributed wrapped in DDP, whose gradients are summed (the objective
    sees the whole global batch on every rank: ``distributed.sum_gradients``)."""
    if not context.enabled:
        return model
    trained = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.index is not None
                                                        else None)
    trained.register_comm_hook(None, sum_gradients)
    return trained


def _batches(session: Session) -> Iterator[tuple[torch.Tensor, torch.Tensor, Any]]:
    """The P x K training batches of the session's sampler, augmented: by the loader's workers, or on the device
    from the decoded images (``data.cache``, which yields what the loader yields)."""
    d, device = session.config.data, session.device
    labels = np.searchsorted(session.classes, session.train_part.labels)
    assert session.sampler is not None  # build_session made it
    if session.cache is not None:
        augment = BatchedTrainTransform(d.image_size, d.resize_range, d.flip, d.train_pad, d.color_jitter)
        return iter(CachedBatches(session.cache, session.sampler, labels, augment, device))
    transform = TrainTransform(d.image_size, d.resize_range, d.flip, d.train_pad, uint8=uint8_batches(device),
                               color_jitter=d.color_jitter)
    dataset = ImageDataset(session.train_part, transform, labels=labels)
    return iter(training_loader(dataset, session.sampler, d.num_workers, d.pin_memory, device))


def _warn_if_constant(constant: ConstantLoss, done: int, value: float, context: DistContext) -> None:
    flat = constant.update(done, value)
    if flat is not None and context.is_main:
        log.warning("the training loss has been exactly %g for %d steps (steps %d-%d): nothing is learning; "
                    "check loss.options (a margin every pair already satisfies?) and the learning rates",
                    value, flat[1] - flat[0] + 1, *flat)


def _log_step(session: Session, done: int, value: float, terms: dict[str, torch.Tensor], step_log: StepLog,
              bar: Any) -> None:
    """One line of ``metrics.jsonl`` (and TensorBoard's scalars): the loss, its terms, the rate, images/s."""
    rate, optimizer = step_log.rate(), session.optimizer
    record = {"step": done, "loss": value, **{k: float(v.detach()) for k, v in terms.items()},
              "lr": optimizer.param_groups[0]["lr"], "images_per_s": rate, **session.precision.log_fields()}
    session.run.append_log(record)
    if session.scalars is not None:
        session.scalars.training(record, optimizer)
    bar.set_postfix(loss=f"{step_log.smoothed:.4f}", img_s=f"{rate:.0f}", refresh=False)
    step_log.restart()


def _finish(session: Session, end: int, seconds: float) -> TrainResult:
    """After the last step: fp16's count of skipped steps, a ``last`` for a run that had nothing left to train, the
    generator's diagnostics; the result."""
    config, run, context, precision = session.config, session.run, session.context, session.precision

    def on_rank_0() -> None:
        if precision.scaler is not None:
            log.info("train.amp=fp16: %d step(s) of the run skipped for overflowing gradients; loss scale %g",
                     precision.skipped, precision.scaler.get_scale())
        if session.start_step >= config.train.steps and not run.last.is_file():
            save_last(session, session.start_step)
        if session.generator is not None:
            _generator_diagnostics(run, config, session.model, session.generator, session.train_part,
                                   session.classes, session.device)

    on_main(context, on_rank_0)
    best = session.best
    return TrainResult(run.path, end, best["step"], best["score"], seconds, session.start_step,
                       session.stopped_early, best.get("metrics"), session.backbone_val,
                       beats_backbone(best, session.backbone_val, config.train.select_by))
