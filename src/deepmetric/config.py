"""The run configuration: every knob of a run in one typed tree, loaded from YAML and ``key=value``.

A run is reproducible from its resolved config (saved as ``config.yaml`` in the run directory) and
its seed. Unknown keys are rejected with the nearest valid key suggested; values are coerced to the
declared type or rejected with the key named.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .data.resizing import TEST_RESIZE_MODES, TRAIN_PAD_MODES
from .errors import ConfigError, did_you_mean
from .evaluation.engines import KNN_ENGINES
from .presets import resolve as resolve_preset

LR_SCHEDULES = ("constant", "cosine", "step")
"""``train.lr_schedule`` choices (training/optim.py)."""


@dataclass
class DataConfig:
    """Data set, sampler and augmentation."""

    spec: str = "glyphs"
    """Loader spec: ``glyphs``, ``fashion-mnist``, ``digits``, ``folder:PATH``, ``csv:PATH``,
    ``cub:PATH``, ``cars:PATH``, ``sop:PATH``, ``inshop:PATH``, or ``cub-cropped:PATH`` / ``cars-cropped:PATH``
    (each image cut to its bounding box)."""
    image_size: int = 224
    """Side of the square training crop and of the test image."""
    resize_range: tuple[float, float] = (0.8, 1.8)
    """Multi-resolution augmentation: the longer side is resized to U[lo, hi] x image_size."""
    flip: bool = True
    """Random horizontal flip at training time (turn off for characters: b/d)."""
    train_pad: str = "size"
    """Before the random crop, pad the resized image to image_size (``size``, the thesis and the HORDE code)
    or its shorter side to the longer one (``square``, ABE), or resize both sides to the drawn length without
    keeping the aspect ratio (``stretch``, ABE's cropped Cars-196)."""
    test_resize: str = "resize"
    """``resize`` (squash to image_size, the thesis), ``resize_crop`` (resize to 1.144x, centre crop,
    the HORDE authors' code), ``pad_crop`` (longer side to 256/224 x keeping the aspect ratio, pad to a
    square, centre crop: ABE), ``stretch_crop`` (both sides to 256/224 x, centre crop: ABE's cropped
    Cars-196) or ``short_crop`` (shorter side to 256/224 x keeping the aspect ratio, centre crop: torchvision's
    Resize(256) + CenterCrop(224), the DGML code)."""
    classes_per_batch: int = 5
    """P of the P x K batch."""
    samples_per_class: int = 8
    """K of the P x K batch."""
    val_fraction: float = 0.0
    """Fraction of the training classes held out (class-disjoint) for model selection."""
    val_seed: int = 0
    check_counts: bool = True
    """Fail when a benchmark's split sizes differ from the published ones."""
    check_images: bool = True
    """Decode every image before training and stop with the list of bad ones (see ``skip_bad_images``)."""
    skip_bad_images: bool = False
    """Leave bad images (and classes left with one image) out instead of stopping; the list goes to the run."""
    num_workers: int = 0
    seed: int = 0
    """Seed of the data set itself where it has one (the glyphs character split)."""


@dataclass
class ModelConfig:
    """Backbone and head (see ``deepmetric.create_model``)."""

    backbone: str = "lite0"
    pretrained: bool = True
    weights: str | None = None
    """Optional safetensors file of backbone weights (e.g. a converted Caffe GoogLeNet or BN-Inception)."""
    trust_pickle: bool = False
    """Allow ``weights`` to be a legacy pickled torch file (read with torch's restricted unpickler)."""
    split: str | None = None
    """Where the backbone is cut into trunk and tail; None lets the head choose."""
    freeze_bn: bool | str = True
    """BatchNorm in the backbone: true freezes its statistics and affine parameters (timm's FrozenBatchNorm2d),
    ``stats`` its statistics only (the affine weight and bias train: the DGML code's ResNet-50), false neither."""
    head: str = "gap"
    embedding_dim: int = 512
    head_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class LossConfig:
    """The objective: a metric loss (see ``deepmetric.losses``) plus regularisers."""

    name: str = "binomial"
    options: dict[str, Any] = field(default_factory=dict)
    on: str | None = None
    """``embedding`` (one loss on the concatenated embedding) or ``parts`` (one per learner); None: the head's
    default."""
    parts_reduction: str | None = None
    """``mean`` or ``sum`` of the per-part losses; None: the head's default."""
    regularizers: dict[str, dict[str, Any]] | None = None
    """``{name: {weight: w, option: value}}``; None: the head's default regularisers, ``{}``: none."""
    miner: str | None = None
    """A pair/triplet miner for a pytorch-metric-learning loss, ``pml:<Class>`` (e.g. ``pml:MultiSimilarityMiner``)."""
    miner_options: dict[str, Any] = field(default_factory=dict)
    """The miner's keyword options."""


@dataclass
class TrainConfig:
    """Optimisation and checkpoints."""

    steps: int = 1000
    lr: float = 1e-5
    """Learning rate of the new layers (head)."""
    lr_backbone: float = 1e-5
    """Learning rate of the pretrained layers."""
    lr_loss: float | None = None
    """Learning rate of parameters that live in the loss (margin's beta, a PML loss's proxies); None means ``lr``, or
    100 x ``lr_backbone`` for a PML loss (``deepmetric.losses.pml``)."""
    weight_decay: float = 0.0
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per parameter group (``pretrained``, ``new``, ``loss`` or a head's own): ``lr_scale`` and ``weight_decay``."""
    lr_schedule: str = "constant"
    """``constant`` (the papers), ``cosine`` (decay to 0 over ``steps``) or ``step`` (the rates are multiplied by
    ``lr_gamma`` at each of ``lr_milestones``: PyTorch's MultiStepLR, Caffe's ``multistep`` policy)."""
    lr_milestones: list[int] = field(default_factory=list)
    """Steps (0-based, increasing) from which ``step`` applies one more factor ``lr_gamma``."""
    lr_gamma: float = 0.1
    """The factor of the ``step`` schedule."""
    eval_every: int = 500
    checkpoint_every: int = 500
    log_every: int = 10
    seed: int = 0
    device: str = "auto"
    deterministic: bool = False
    """Ask torch for deterministic kernels (slower on GPU; CPU kernels already are)."""
    threads: int = 0
    """torch intra-op threads; 0 keeps torch's default."""
    amp: bool = False
    """Mixed precision: forward passes under bfloat16 autocast (weights, optimiser and losses stay float32); no
    faster than float32 on CPU (docs/benchmarks.md), meant for GPUs."""
    channels_last: bool = True
    """Run convolutions in channels-last (NHWC) layout: about 2x faster on CPU, same results up to float."""
    tensorboard: bool = False
    """Also write the log's scalars (loss terms, learning rates, images/s, validation metrics) as TensorBoard event
    files to ``RUN/tensorboard/`` (the extra ``deepmetric[tensorboard]``)."""


@dataclass
class EvalConfig:
    """Evaluation protocol."""

    recall_at: list[int] | None = None
    """Ranks K of Recall@K; None uses the data set's standard ranks."""
    batch_size: int = 128
    nmi: bool = True
    engine: str = "auto"
    """kNN engine (KNN_ENGINES): torch, numpy (torch with numpy's BLAS products), faiss or cuda (torch on the GPU);
    auto is cuda where torch sees a CUDA device, else numpy on CPUs where torch's MKL is slow (not made by Intel),
    torch otherwise. All exact (they may order neighbours whose similarities differ by a float rounding error
    differently)."""
    baseline: bool = False
    """Before training, evaluate the untrained backbone's pooled features on the test split."""
    report: bool = True
    """After the test evaluation of ``deepmetric train``, write ``RUN/report.html`` (``deepmetric report``)."""


@dataclass
class GeneratorConfig:
    """An example generator that adds synthetic rows to every batch (see ``deepmetric.generators``)."""

    name: str | None = None
    """``mirage`` (thesis ch. 6) or None: no generator, the plain pipeline."""
    options: dict[str, Any] = field(default_factory=dict)
    """The generator's options (e.g. MIRAGE's ``mode``, ``batch_ratio``, ``virtual_ratio``)."""


@dataclass
class RunConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(dataclasses.asdict(self))


def _to_plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_plain(v) for v in value]
    return value


def _coerce_bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.lower() in ("true", "yes", "1")
    raise ConfigError(f"config key '{key}': expected true or false, got {value!r}")


def _coerce_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigError(f"config key '{key}': expected an integer, got {value!r}")
    if isinstance(value, int):
        return value
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"config key '{key}': expected an integer, got {value!r}") from None
    if not math.isfinite(number) or number != int(number):  # 1e400 is inf, .nan is not a number
        raise ConfigError(f"config key '{key}': expected an integer, got {value!r}")
    return int(number)


def _coerce_float(value: Any, key: str) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"config key '{key}': expected a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"config key '{key}': expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ConfigError(f"config key '{key}': expected a finite number, got {value!r}")
    return number


def _coerce_str(value: Any, key: str) -> str:
    if isinstance(value, dict | list):
        raise ConfigError(f"config key '{key}': expected a string, got {value!r}")
    return str(value)


SCALARS = {bool: _coerce_bool, int: _coerce_int, float: _coerce_float, str: _coerce_str}
"""How a YAML value becomes each scalar type of the config."""


def _coerce_union(value: Any, args: tuple[Any, ...], annotation: Any, key: str) -> Any:
    if value is None and type(None) in args:
        return None
    for arg in args:
        if arg is type(None):
            continue
        try:
            return _coerce(value, arg, key)
        except ConfigError:
            continue
    raise ConfigError(f"config key '{key}': {value!r} is not a valid {annotation}")


def _coerce_sequence(value: Any, origin: Any, args: tuple[Any, ...], key: str) -> list[Any] | tuple[Any, ...]:
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list | tuple):
        raise ConfigError(f"config key '{key}': expected a list, got {value!r}")
    if origin is tuple and args and args[-1] is not Ellipsis:
        if len(value) != len(args):
            raise ConfigError(f"config key '{key}': expected {len(args)} values, got {value!r}")
        return tuple(_coerce(v, a, key) for v, a in zip(value, args, strict=True))
    item_type = args[0] if args else Any
    coerced = [_coerce(v, item_type, key) for v in value]
    return tuple(coerced) if origin is tuple else coerced


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Coerce a YAML value to the annotated type, or raise a ConfigError naming the key."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(value, args, annotation, key)
    if annotation is Any:
        return value
    if annotation in SCALARS:
        return SCALARS[annotation](value, key)
    if origin in (list, tuple):
        return _coerce_sequence(value, origin, args, key)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{key}': expected a mapping, got {value!r}")
        return dict(value)
    raise ConfigError(f"config key '{key}': unsupported type {annotation}")


def _apply(target: Any, values: dict[str, Any], prefix: str = "") -> None:
    hints = typing.get_type_hints(type(target))
    names = [f.name for f in dataclasses.fields(target)]
    for key, value in values.items():
        full = f"{prefix}{key}"
        if key not in names:
            valid = [f"{prefix}{n}" for n in names]
            raise ConfigError(f"unknown config key '{full}'{did_you_mean(full, valid + _all_keys())}")
        current = getattr(target, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"config key '{full}' is a section; expected a mapping, got {value!r}")
            _apply(current, value, prefix=f"{full}.")
        elif hints[key] == dict[str, Any] and isinstance(value, dict) and isinstance(current, dict):
            merged = dict(current)
            merged.update(value)
            setattr(target, key, merged)
        else:
            setattr(target, key, _coerce(value, hints[key], full))


def _all_keys() -> list[str]:
    keys = []
    for section in dataclasses.fields(RunConfig):
        for f in dataclasses.fields(section.default_factory()):  # type: ignore[misc]
            keys.append(f"{section.name}.{f.name}")
    return keys


def nest(dotted: str, value: Any) -> dict[str, Any]:
    """``nest("train.lr", 1e-4)`` -> ``{"train": {"lr": 0.0001}}``."""
    parts = dotted.split(".")
    nested: dict[str, Any] = {parts[-1]: value}
    for part in reversed(parts[:-1]):
        nested = {part: nested}
    return nested


def parse_override(text: str) -> dict[str, Any]:
    """``'train.lr=1e-4'`` -> ``{'train': {'lr': 0.0001}}`` (the value is read as YAML)."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' is not of the form key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override '{text}' has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return nest(key, value)


def merge_layers(base: dict[str, Any], layer: dict[str, Any]) -> dict[str, Any]:
    """``layer`` over ``base``, section by section (nested mappings merge, everything else replaces)."""
    merged = dict(base)
    for key, value in layer.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_layers(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_yaml(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a config file, or the packaged preset of that name (``abe/cub-abe8``: ``deepmetric.presets``; a file
    that exists wins); ``extends: OTHER.yaml`` (relative to this file, else a preset's name) loads OTHER first and
    merges."""
    path = resolve_preset(path, "config")
    if path.resolve() in _seen:
        raise ConfigError(f"config file {path} extends itself (through {' -> '.join(str(p) for p in _seen)})")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(f"config file {path} is not valid YAML: {error}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not text (YAML in UTF-8)") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections, got {type(data).__name__}")
    parent = data.pop("extends", None)
    if parent is None:
        return data
    return merge_layers(load_yaml(extended(path, parent), (*_seen, path.resolve())), data)


def extended(path: Path, parent: Any) -> Path:
    """The file that ``extends: parent`` in ``path`` names: relative to ``path``'s folder, else a packaged preset."""
    if not isinstance(parent, str) or not parent.strip():
        raise ConfigError(f"config file {path}: 'extends' must name a YAML file or a preset, got {parent!r}")
    relative = path.parent / parent
    if relative.is_file():
        return relative
    return resolve_preset(parent, "config", what=f"{path}: extends")


def build_config(*layers: dict[str, Any]) -> RunConfig:
    """Defaults, then each layer (YAML file, CLI flags, key=value overrides) in order."""
    config = RunConfig()
    for layer in layers:
        _apply(config, layer)
    validate(config)
    return config


def _at_least(section: str, values: Any, minimum: float, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(values, name)
        if value is not None and value < minimum:
            raise ConfigError(f"{section}.{name} must be at least {minimum:g}, got {value}")


def _validate_data(d: DataConfig) -> None:
    if not 8 <= d.image_size <= 8192:
        raise ConfigError(f"data.image_size must be from 8 to 8192, got {d.image_size}")
    lo, hi = d.resize_range
    if not 0 < lo <= hi:
        raise ConfigError(f"data.resize_range must satisfy 0 < lo <= hi, got {list(d.resize_range)}")
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


def _validate_model(m: ModelConfig) -> None:
    if m.freeze_bn not in (True, False, "stats"):
        raise ConfigError(f"model.freeze_bn must be true, false or stats, got {m.freeze_bn!r}")
    _at_least("model", m, 0, ("embedding_dim",))


def _validate_loss(loss: LossConfig) -> None:
    if loss.on not in (None, "embedding", "parts"):
        raise ConfigError(f"loss.on must be 'embedding' or 'parts', got '{loss.on}'")
    if loss.parts_reduction not in (None, "mean", "sum"):
        raise ConfigError(f"loss.parts_reduction must be 'mean' or 'sum', got '{loss.parts_reduction}'")


def _validate_train(t: TrainConfig) -> None:
    _at_least("train", t, 0, ("steps", "lr", "lr_backbone", "lr_loss", "weight_decay", "threads"))
    _at_least("train", t, 1, ("eval_every", "checkpoint_every", "log_every"))
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
            number = _coerce_float(value, f"train.groups.{group}.{name}")
            if number < 0:
                raise ConfigError(f"train.groups.{group}.{name} must be at least 0, got {value}")


def _validate_eval(e: EvalConfig) -> None:
    if e.engine not in KNN_ENGINES:
        raise ConfigError(f"eval.engine must be one of {', '.join(KNN_ENGINES)}, got '{e.engine}'")
    if e.recall_at is not None and any(k < 1 for k in e.recall_at):
        raise ConfigError(f"eval.recall_at must hold positive ranks, got {e.recall_at}")
    _at_least("eval", e, 1, ("batch_size",))


def _validate_generator(g: GeneratorConfig) -> None:
    if g.name is not None:
        from .generators import check_generator_options

        check_generator_options(g.name, g.options)
    elif g.options:
        raise ConfigError("generator.options are set but generator.name is not (e.g. generator.name=mirage)")


def validate(config: RunConfig) -> None:
    """Checks that need more than one value's type, section by section, then the plug-in names and options."""
    _validate_data(config.data)
    _validate_model(config.model)
    _validate_train(config.train)
    _validate_loss(config.loss)
    _validate_eval(config.eval)
    _check_names(config)
    _validate_generator(config.generator)


def _check_names(config: RunConfig) -> None:
    """The backbone, head, loss and regularisers exist and take the options given, checked before anything is
    built or read (a typo should not wait for an image audit of the whole data set)."""
    from .losses import check_loss_options, check_regularizer_options
    from .models.backbones import check_backbone_name
    from .models.heads import check_head_options

    check_backbone_name(config.model.backbone)
    check_head_options(config.model.head, config.model.head_options)
    check_loss_options(config.loss.name, config.loss.options, config.loss.miner, config.loss.miner_options)
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


def config_from_dict(data: dict[str, Any]) -> RunConfig:
    """Rebuild a resolved config (e.g. a run directory's ``config.yaml``)."""
    return build_config(data)


def save_config(config: RunConfig, path: str | Path) -> None:
    from .io import atomic_write_text

    atomic_write_text(Path(path), yaml.safe_dump(config.to_dict(), sort_keys=False))
