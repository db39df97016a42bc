"""A training session: what one call of ``train`` works with (``Session``), built and checked piece by piece before
anything is written (``build_session``), and the first writes to the run folder once every check has passed."""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..config import RunConfig, save_config
from ..data import PKSampler, TestTransform
from ..data.cache import ImageCache
from ..data.table import RetrievalTable
from ..data.torch_dataset import ImageDataset, inference_loader
from ..devices import resolve_device
from ..distributed import DistContext, on_main
from ..errors import DeepMetricError
from ..generators import Generator, build_generator
from ..io.files import atomic_write_text
from ..io.strict import load_json, to_json
from ..losses import Objective, build_objective, check_objective
from ..models import Embedder
from ..provenance import environment
from ..runs.folder import RunDir
from ..runs.table import load_table
from .optim import build_optimizer
from .precision import Precision
from .scalars import TensorBoardScalars
from .setup import build_model, seed_everything, untrained_baseline
from .state import Checkpoint, resume_session

log = logging.getLogger("deepmetric")


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
    precision: Precision
    """``train.amp``: the forward's autocast, the objective in float32, fp16's gradient scaler."""
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


def training_sample(config: RunConfig, train_part: RetrievalTable,
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
    _, loader = training_sample(config, train_part, count)
    log.info("initialising the %s head from %d training images", config.model.head, count)
    model.initialize_head(images.to(device) for images, _, _ in loader)


def example_generator(config: RunConfig, model: Embedder, num_classes: int,
                     context: DistContext) -> Generator | None:
    """The run's example generator (``generator.name``), or None: the plain pipeline."""
    if config.generator.name is None:
        return None
    if context.enabled:
        raise DeepMetricError("example generators (generator.name) run in one process; drop --nproc/torchrun")
    batch_size = config.data.classes_per_batch * config.data.samples_per_class
    return build_generator(config.generator.name, config.generator.options, head=model.head,
                           num_classes=num_classes, batch_size=batch_size, lr=config.train.lr, seed=config.train.seed)


def prepare_run_dir(run: RunDir, resume: bool, config: RunConfig, context: DistContext) -> None:
    """A run folder holds a run once it has a checkpoint; one that stopped before its first (a failed start)
    starts afresh, and ``--resume`` needs a checkpoint whose model, objective and groups the config keeps. Rank 0
    alone looks at the folder and prepares it (``on_main``): the other ranks, which may run on machines without it,
    stop with rank 0 when it refuses."""
    on_main(context, lambda: _prepare_run_dir(run, resume, config, context))


def _prepare_run_dir(run: RunDir, resume: bool, config: RunConfig, context: DistContext) -> None:
    if run.last.is_file() and not resume:
        raise DeepMetricError(f"{run.path} already holds a run; pass --resume to continue it or choose another --out")
    if resume and not run.last.is_file() and context.enabled:  # rank 0 may be on a machine without the run folder
        found = "it holds no checkpoint" if run.path.is_dir() else "there is no such folder"
        raise DeepMetricError(f"cannot resume {run.path}: {found} on rank 0 (host {socket.gethostname()}). Rank 0 "
                              f"reads and writes the run folder: run rank 0 on the machine that holds {run.last} "
                              "(docs/cli.md, 'Training on several machines')")
    if resume and not run.last.is_file():
        raise DeepMetricError(f"cannot resume {run.path}: it holds no checkpoint (the run stopped before its first); "
                              "start it again without --resume")
    if resume:
        run.check_resumable(config)
    elif run.exists():
        log.warning("%s holds a run that stopped before its first checkpoint: starting it afresh", run.path)
        run.clear_failed_start()
    run.remove_stale_temporaries()


def set_up_process(t: Any, context: DistContext) -> torch.device:
    """Threads, determinism and seeds of this process; its device."""
    if t.threads:
        torch.set_num_threads(t.threads)
    if t.deterministic:
        # cuBLAS is deterministic only with a fixed workspace, read when its first handle is made in the process
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    seed_everything(t.seed)
    return resolve_device(t.device, context.local_rank)


def build_session(config: RunConfig, run: RunDir, context: DistContext, device: torch.device,
                  checkpoint: Checkpoint | None, progress: bool) -> tuple[Session, list[Any]]:
    """Everything training needs, each piece checked before anything is written: the model first (a missing or
    misfitting weight file is found before minutes of image audit), then the data and its audit, the
    objective, optimiser and generator, the state of ``last`` (``checkpoint``, read by ``state.read_last``) when
    resuming, and the sampler (a data set too small for a P x K batch is refused here). Returns the session and the
    bad items the audit left out. No collective runs here: a rank that fails leaves the others at the caller's
    ``agreed``."""
    resume = checkpoint is not None
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
    generator = example_generator(config, model, len(classes), context)
    extra_classes = generator.extra_classes if generator is not None else 0
    objective = build_objective(config.loss, model.head, num_classes=len(classes) + extra_classes).to(device)
    optimizer = build_optimizer(model, objective, config.train)
    if generator is not None:
        generator.to(device)
    session = Session(config, run, context, device, progress, model, table, train_part, classes, objective,
                      optimizer, Precision(config.train.amp, device), generator)
    if checkpoint is not None:
        resume_session(session, checkpoint)
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


def first_writes(session: Session, bad_items: list[Any]) -> None:
    """What rank 0 writes once every check has passed (``on_main``: the other ranks wait for it, and stop with it
    when it fails): the bad items left out, the config, this session's environment, the untrained baseline; a
    resumed run's log loses the steps after its checkpoint."""
    on_main(session.context, lambda: _write_first(session, bad_items))


def _write_first(session: Session, bad_items: list[Any]) -> None:
    config, run, context = session.config, session.run, session.context
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
        session.backbone_val = backbone_on_validation(session)


def backbone_on_validation(session: Session) -> dict[str, float]:
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
