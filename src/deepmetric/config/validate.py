"""Checks that need more than one value's type: bounds and combinations section by section, then the plug-in names
and their options (before any data is read)."""

from __future__ import annotations

import math
import types
import typing
from typing import Any, Literal

from ..data.jitter_options import check_strengths
from ..data.resizing import TEST_RESIZE_MODES, TRAIN_PAD_MODES
from ..errors import ConfigError
from ..evaluation.engines import KNN_ENGINES
from .sections import (
    AMP_MODES,
    LR_SCHEDULES,
    DataConfig,
    EvalConfig,
    GeneratorConfig,
    LossConfig,
    ModelConfig,
    RunConfig,
    TrainConfig,
)
from .values import SCALARS, apply_values, coerce, coerce_float

MAX_SEED = 2**32 - 1
"""Seeds (``train.seed``, ``data.seed``, ``data.val_seed``) are integers from 0 to this, the range numpy's and
Python's generators are seeded with everywhere (-1 and 2**70 were tracebacks from numpy and torch)."""
MAX_EMBEDDING_DIM = 65_536
"""Widest ``model.embedding_dim``: the papers use 64 to 8,192 (HORDE's high orders), and 10**12 was an attempt to
allocate 128 TB."""
MAX_WORKERS = 128
"""Most ``data.num_workers``: each is a process decoding images; the default starts at most 12, and 1,000,000 was
accepted and started."""


SELECT_BY = {"recall@1": "Recall@1", "map@r": "MAP@R"}
"""What ``train.select_by`` may name (``training.selection.selection_key``), and how what a run says names it."""


def _at_least(section: str, values: Any, minimum: float, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(values, name)
        if value is not None and value < minimum:
            raise ConfigError(f"{section}.{name} must be at least {minimum:g}, got {value}")


def _at_most(section: str, values: Any, maximum: int, names: tuple[str, ...], why: str) -> None:
    for name in names:
        value = getattr(values, name)
        if value is not None and value > maximum:
            raise ConfigError(f"{section}.{name} must be at most {maximum:,} ({why}), got {value:,}")


def _seeds(section: str, values: Any, names: tuple[str, ...]) -> None:
    _at_least(section, values, 0, names)
    _at_most(section, values, MAX_SEED, names, "2**32 - 1: the seeds numpy takes")


def _validate_data(d: DataConfig) -> None:
    if not 8 <= d.image_size <= 8192:
        raise ConfigError(f"data.image_size must be from 8 to 8192, got {d.image_size}")
    lo, hi = d.resize_range
    if not 0 < lo <= hi:
        raise ConfigError(f"data.resize_range must satisfy 0 < lo <= hi, got {list(d.resize_range)}")
    try:
        check_strengths(d.color_jitter)
    except ValueError as error:
        raise ConfigError(f"data.{error}") from None
    if d.test_resize not in TEST_RESIZE_MODES:
        raise ConfigError(f"data.test_resize must be one of {', '.join(TEST_RESIZE_MODES)}, got '{d.test_resize}'")
    if d.train_pad not in TRAIN_PAD_MODES:
        raise ConfigError(f"data.train_pad must be one of {', '.join(TRAIN_PAD_MODES)}, got '{d.train_pad}'")
    if d.classes_per_batch < 2:
        raise ConfigError("data.classes_per_batch must be at least 2 (a batch needs negatives)")
    if d.samples_per_class < 2:
        raise ConfigError("data.samples_per_class must be at least 2 (a batch needs positives)")
    if not 0.0 <= d.val_fraction < 1.0:
        raise ConfigError(f"data.val_fraction must be in [0, 1), got {d.val_fraction}")
    _at_least("data", d, 0, ("num_workers",))
    _at_most("data", d, MAX_WORKERS, ("num_workers",), "each is a process decoding images")
    _seeds("data", d, ("seed", "val_seed"))


def _validate_model(m: ModelConfig) -> None:
    if m.freeze_bn not in (True, False, "stats"):
        raise ConfigError(f"model.freeze_bn must be true, false or stats, got {m.freeze_bn!r}")
    _at_least("model", m, 0, ("embedding_dim",))
    _at_most("model", m, MAX_EMBEDDING_DIM, ("embedding_dim",), "the papers use 64 to 8,192")


def _scalar_type(annotation: Any) -> bool:
    """Whether ``annotation`` is a scalar the config types (``int``), or a union of those and None."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else (
        annotation,)
    return all(arg in SCALARS or arg is type(None) for arg in args)


def typed_head_options(head: str, options: dict[str, Any], prefix: str = "model.head_options") -> dict[str, Any]:
    """``options`` of head ``head``, every name checked (``HEADS.check``) and every value of a scalar type coerced to
    the type the head declares, as the config types its own keys (``codewords: many`` was a ``TypeError``
    traceback from inside the head)."""
    from ..models.heads import check_head_options

    cls = check_head_options(head, options)
    declared = cls.option_types()
    return {name: coerce(value, declared[name], f"{prefix}.{name}") if _scalar_type(declared[name]) else value
            for name, value in options.items()}


def model_spec_config(spec: dict[str, Any]) -> ModelConfig:
    """A checkpoint's ``model_spec`` (the ``model`` section it was trained with, as ``Embedder.spec`` holds it) typed
    and checked as the config's ``model`` section is: the same types, bounds, head names and options, so a file can
    ask for nothing the config would refuse (``head_options: {trust_pickle: true, weights: x.pth}`` reached
    ``create_model`` as its own keywords and loaded a pickle without --trust-pickle)."""
    model = ModelConfig()
    apply_values(model, spec, prefix="model.")
    _validate_model(model)
    _finite_options("model.head_options", model.head_options)
    from ..models.backbones import check_backbone_name

    check_backbone_name(model.backbone)
    model.head_options = typed_head_options(model.head, model.head_options)
    return model


def _validate_loss(loss: LossConfig) -> None:
    if loss.on not in (None, "embedding", "parts"):
        raise ConfigError(f"loss.on must be 'embedding' or 'parts', got '{loss.on}'")
    if loss.parts_reduction not in (None, "mean", "sum"):
        raise ConfigError(f"loss.parts_reduction must be 'mean' or 'sum', got '{loss.parts_reduction}'")
    _at_least("loss.memory", loss.memory, 0, ("size", "warmup_steps", "weight"))


def _validate_memory(config: RunConfig) -> None:
    """A cross-batch memory holds at least one batch and starts before the run ends."""
    memory, d, steps = config.loss.memory, config.data, config.train.steps
    if not memory.size:
        return
    batch = d.classes_per_batch * d.samples_per_class
    if memory.size < batch:
        raise ConfigError(f"loss.memory.size must be at least one batch (data.classes_per_batch x "
                          f"data.samples_per_class = {batch}), got {memory.size}")
    if memory.warmup_steps >= steps:
        raise ConfigError(f"loss.memory.warmup_steps={memory.warmup_steps} is not below train.steps={steps}: the "
                          "memory would never start; lower loss.memory.warmup_steps (the paper waits 1,000 of its "
                          "SOP iterations) or set loss.memory.size=0")


def amp_mode(value: Any, key: str = "train.amp") -> str | Literal[False]:
    """``train.amp`` (or ``eval.amp``: ``key``) as the trainer reads it: ``fp16``, ``bf16`` (``true`` too: the
    setting was a switch for bfloat16 before fp16 came, and run folders keep ``amp: true``) or False; anything else
    is refused, naming the choices."""
    if isinstance(value, bool):
        return "bf16" if value else False
    if isinstance(value, str) and value.lower() in AMP_MODES:
        return value.lower()
    raise ConfigError(f"{key} must be one of {', '.join(AMP_MODES)}, false (true means bf16), got {value!r}")


def set_inference(config: Any, amp: str | bool | None = None, compile: bool | None = None) -> None:
    """Set ``config.eval.amp`` (``bf16``, ``fp16``, False) and ``config.eval.compile`` for the embedding passes that
    read ``config`` (a command's ``--amp`` and ``--compile``, ``TrainedRun.set_inference``); None keeps a setting."""
    if amp is not None:
        config.eval.amp = amp_mode(amp, "amp")
    if compile is not None:
        if not isinstance(compile, bool):
            raise ConfigError(f"compile must be True or False, not {compile!r}")
        config.eval.compile = compile


def _validate_train(t: TrainConfig) -> None:
    t.amp = amp_mode(t.amp)
    _at_least("train", t, 0, ("steps", "lr", "lr_backbone", "lr_loss", "weight_decay", "threads", "patience"))
    _seeds("train", t, ("seed",))
    _at_least("train", t, 1, ("eval_every", "checkpoint_every", "log_every"))
    if t.select_by not in SELECT_BY:
        raise ConfigError(f"train.select_by must be one of {', '.join(SELECT_BY)}, got '{t.select_by}'")
    if t.lr_schedule not in LR_SCHEDULES:
        raise ConfigError(f"train.lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got '{t.lr_schedule}'")
    if t.lr_schedule == "step":
        if not t.lr_milestones or any(b <= a for a, b in zip(t.lr_milestones, t.lr_milestones[1:], strict=False)) \
                or t.lr_milestones[0] < 1:
            raise ConfigError(f"train.lr_schedule=step needs train.lr_milestones: increasing steps >= 1, got "
                              f"{t.lr_milestones}")
        if t.lr_gamma <= 0:
            raise ConfigError(f"train.lr_gamma must be > 0, got {t.lr_gamma}")
    elif t.lr_milestones:
        raise ConfigError(f"train.lr_milestones is used by train.lr_schedule=step only (the schedule is "
                          f"'{t.lr_schedule}')")
    for group, options in t.groups.items():
        if not isinstance(options, dict):
            raise ConfigError(f"train.groups.{group} must be a mapping of lr_scale and weight_decay, got {options!r}")
        unknown = set(options) - {"lr_scale", "weight_decay"}
        if unknown:
            raise ConfigError(f"train.groups.{group}: unknown option(s) {sorted(unknown)}; expected lr_scale, "
                              "weight_decay")
        for name, value in options.items():
            number = coerce_float(value, f"train.groups.{group}.{name}")
            if number < 0:
                raise ConfigError(f"train.groups.{group}.{name} must be at least 0, got {value}")


def _validate_eval(e: EvalConfig) -> None:
    e.amp = amp_mode(e.amp, "eval.amp")
    if e.engine not in KNN_ENGINES:
        raise ConfigError(f"eval.engine must be one of {', '.join(KNN_ENGINES)}, got '{e.engine}'")
    if e.recall_at is not None and any(k < 1 for k in e.recall_at):
        raise ConfigError(f"eval.recall_at must hold positive ranks, got {e.recall_at}")
    _at_least("eval", e, 1, ("batch_size",))


def _validate_generator(g: GeneratorConfig, amp: str | bool = False) -> None:
    if g.name is not None:
        from ..generators import check_generator_options

        check_generator_options(g.name, g.options)
        if amp == "fp16":  # (the trainer's scaler unscales the model's optimiser only)
            raise ConfigError(f"train.amp=fp16 does not combine with generator.name={g.name}: the generator steps "
                              "parameters of its own with gradients of the trainer's backward pass, which fp16's "
                              "loss scale multiplies; use train.amp=bf16 or false")
    elif g.options:
        raise ConfigError("generator.options are set but generator.name is not (e.g. generator.name=mirage)")


def _finite_options(key: str, value: Any) -> None:
    """Refuse a NaN or infinite number anywhere in a plug-in's options (``loss.options.m=.nan`` trained to the end
    with a loss of exactly 0), as ``coerce_float`` refuses ``train.lr=.nan``: a float, or a string that reads as
    one (``nan``, ``1e999``), in nested mappings and lists too."""
    if isinstance(value, dict):
        for name, item in value.items():
            _finite_options(f"{key}.{name}", item)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _finite_options(f"{key}[{i}]", item)
    elif isinstance(value, float | str) and not isinstance(value, bool):
        try:
            number = float(value)
        except (TypeError, ValueError):
            return
        if not math.isfinite(number):
            raise ConfigError(f"config key '{key}': expected a finite number, got {value!r}")


def _validate_plug_in_options(config: RunConfig) -> None:
    _finite_options("model.head_options", config.model.head_options)
    _finite_options("loss.options", config.loss.options)
    _finite_options("loss.miner_options", config.loss.miner_options)
    _finite_options("loss.regularizers", config.loss.regularizers or {})
    _finite_options("generator.options", config.generator.options)


def validate(config: RunConfig) -> None:
    """Checks that need more than one value's type, section by section, then the plug-in names and options."""
    _validate_plug_in_options(config)
    _validate_data(config.data)
    _validate_model(config.model)
    _validate_train(config.train)
    _validate_loss(config.loss)
    _validate_memory(config)
    _validate_eval(config.eval)
    _check_names(config)
    _validate_generator(config.generator, config.train.amp)


def _check_names(config: RunConfig) -> None:
    """The backbone, head, loss and regularisers exist and take the options given, checked before anything is
    built or read (a typo should not wait for an image audit of the whole data set)."""
    from ..losses import check_loss_options, check_memory_loss, check_regularizer_options
    from ..models.backbones import check_backbone_name

    check_backbone_name(config.model.backbone)
    config.model.head_options = typed_head_options(config.model.head, config.model.head_options)
    check_loss_options(config.loss.name, config.loss.options, config.loss.miner, config.loss.miner_options)
    if config.loss.memory.size:
        check_memory_loss(config.loss.name)
    for name, options in (config.loss.regularizers or {}).items():
        check_regularizer_options(name, options)
    if config.train.tensorboard:
        check_tensorboard()


def check_tensorboard() -> None:
    """Refuse ``train.tensorboard`` without the tensorboard package, naming the install command."""
    import importlib.util

    if importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("train.tensorboard=true needs the tensorboard package, which is not installed: "
                          "pip install 'deepmetric[tensorboard]' (or pip install tensorboard)")
