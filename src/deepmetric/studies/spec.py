"""The study file: what to vary, over which seeds or splits, on which base config.

```yaml
name: demo                        # the study's name (default: the file's stem)
base: ../demo-glyphs.yaml         # a run config (relative to this file, or a preset's name), or one inline
                                  #   ({data: {...}, model: {...}}, ``extends:`` allowed); every run starts from it
out: runs/studies/demo            # where runs and results go (default runs/studies/<name>)
record: docs/studies/demo         # optional: keep each finished run's config, log and metrics here too (a folder
                                  #   to commit; a fresh checkout restores them instead of retraining: record.py)
set: {train.steps: 200}           # overrides applied to every run
variants:                         # named variants, each a set of overrides ...
  gap: {}
  diablo: {model.head: diablo}
grid:                             # ... and/or a grid whose product makes more variants
  loss.name: [binomial, contrastive]
seeds: [0, 1, 2]                  # repeat every variant with train.seed = s (distinct integers >= 0)
splits: 10                        # or the DIABLO protocol (§4.2): s = 0..9 class-disjoint train/val partitions
split_fraction: 0.5               #   of the training classes (half validate, in (0, 1)), model selection on val
all_embeddings: true              # also `evaluate --all-embeddings` every run (ABE's learners and their mean ±
                                  #   std, DeML's scales, HORDE's orders and †): results-all-embeddings.{csv,md}
compare: [gap]                    # optional: results.md also gives each variant's difference from these
                                  #   variants' means, Welch's test and a paired bootstrap, marked where Welch's
                                  #   test is significant after Holm's correction (statistics.py)
seed_validation: true             # with seeds: each seed also draws its own validation classes
                                  #   (data.val_seed = seed; the test classes stay fixed)
tune: {trials: 12, space: {...}}  # tune every variant first, the same budget each (search_space.py), then run
                                  #   the seeds with each variant's best trial's values (tuning.py)
```

A variant named in ``variants`` and the grid combine: each named variant is crossed with the grid. A variant's
name (and so its run folder) and the study's name (its default ``out``) may not hold ``/``, ``..`` or control
characters. ``key=value`` overrides given on
the command line (``deepmetric study FILE data.spec=cub:/data/CUB_200_2011``) apply to every run, after the
study's own settings (the seed or split of each repeat still comes last).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..config import build_config, extended, load_yaml, merge_layers
from ..config.layers import dotted_layer, read_yaml
from ..errors import ConfigError, did_you_mean
from ..presets import resolve as resolve_preset
from .search_space import TuneSpec, parse_tune

KEYS = ("name", "base", "out", "record", "set", "variants", "grid", "seeds", "splits", "split_fraction",
        "all_embeddings", "compare", "seed_validation", "tune")


@dataclass
class StudyRun:
    """One run of a study: its variant, its repeat (seed or split index) and its resolved config layers."""

    variant: str
    repeat: int
    layers: list[dict[str, Any]]

    @property
    def name(self) -> str:
        return f"{self.variant}/{self.repeat}"


@dataclass
class StudySpec:
    name: str
    base: dict[str, Any]
    out: Path
    common: dict[str, Any] = field(default_factory=dict)
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    repeats: list[int] = field(default_factory=lambda: [0])
    protocol: str = "seeds"
    split_fraction: float = 0.5
    all_embeddings: bool = False
    overrides: dict[str, Any] = field(default_factory=dict)
    """Config layers given with the study (``load_study``'s ``command_line``), over every variant's settings."""
    settings: dict[str, Any] = field(default_factory=dict)
    """``key=value`` settings from the command line (dotted keys), last over every run's layers: each sets one value
    (``dotted_layer``; a regulariser's weight keeps the run's other regularisers)."""
    record: Path | None = None
    """Where each finished run's small files are kept as well (``studies.record``), or none."""
    compare: list[str] = field(default_factory=list)
    """The reference variants each variant is set against in ``results.md`` (``comparison.comparison``)."""
    seed_validation: bool = False
    """With seeds: each seed also draws its own validation classes (``data.val_seed``)."""
    tune: TuneSpec | None = None
    """The ``tune:`` section (``search_space``), or none."""
    tuned: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each tuned variant's best trial's values as a config layer (filled by the runner once its tuning is done)."""

    def run_dir(self, run: StudyRun) -> Path:
        """Where ``run`` trains: ``<out>/runs/<variant>/<repeat>``."""
        return self.out / "runs" / run.variant / str(run.repeat)

    def record_dir(self, run: StudyRun) -> Path | None:
        """Where ``run``'s record is kept: ``<record>/<variant>/<repeat>``, or none without a record."""
        return None if self.record is None else self.record / run.variant / str(run.repeat)

    def trial_layers(self, variant: str, values: dict[str, Any]) -> list[dict[str, Any]]:
        """The config layers of a tuning trial of ``variant``: the study's, the variant's, the command line's, then
        the trial's ``values`` (dotted keys: each sets one value, ``dotted_layer``; a searched regulariser's weight
        keeps the variant's other regularisers and options)."""
        layers = self._with_settings([self.base, self.common, self.variants[variant], self.overrides])
        return [*layers, _dotted(values, "tune", layers)]

    def _with_settings(self, layers: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``layers`` and, over them, the command line's ``settings`` (when there are any)."""
        return [*layers, _dotted(self.settings, "command line", layers)] if self.settings else layers

    def runs(self, only: list[str] | tuple[str, ...] = ()) -> list[StudyRun]:
        """Every run (of the variants in ``only``, when given; a name that is no variant is refused), repeat by
        repeat (all variants of the first seed or split come first, so a study stopped early already compares
        every variant)."""
        unknown = [name for name in only if name not in self.variants]
        if unknown:
            raise ConfigError(f"study {self.name}: no variant named {unknown[0]!r}"
                              + variant_hint(unknown[0], self.variants))
        layers = {variant: self._with_settings([self.base, self.common, overrides, self.tuned.get(variant, {}),
                                                self.overrides])
                  for variant, overrides in self.variants.items() if not only or variant in only}
        runs = []
        for repeat in self.repeats:
            for variant in layers:
                if self.protocol == "splits":
                    per_repeat = {"data": {"val_fraction": self.split_fraction, "val_seed": repeat}}
                else:
                    per_repeat = {"train": {"seed": repeat}}
                    if self.seed_validation:
                        per_repeat["data"] = {"val_seed": repeat}
                runs.append(StudyRun(variant, repeat, [*layers[variant], per_repeat]))
        return runs


def variant_hint(name: str, variants: dict[str, Any]) -> str:
    """What follows "no variant <name>" in an error: the nearest variant's name and the whole list."""
    return f"{did_you_mean(name, variants)} (its variants: {', '.join(variants)})"


def _dotted(mapping: dict[str, Any], where: str, below: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """``{"train.steps": 3}`` -> ``{"train": {"steps": 3}}`` (values kept as given), over the layers ``below``: a key
    deeper than a setting (``loss.regularizers.horde.weight``) sets that one value and keeps the rest of the setting
    as ``below`` built it (``config.layers.dotted_layer``)."""
    if not isinstance(mapping, dict):
        raise ConfigError(f"study: '{where}' must be a mapping of config keys, got {mapping!r}")
    deep = any(str(key).count(".") > 1 for key in mapping)  # only a key inside a setting needs the config below
    return dotted_layer(mapping, _resolved(below or []) if deep else {})


def _resolved(layers: list[dict[str, Any]]) -> dict[str, Any]:
    """The config ``layers`` build, as a mapping (``RunConfig.to_dict()``); where they do not build alone (a
    setting that a later layer completes), their merge."""
    try:
        return build_config(*layers).to_dict()
    except ConfigError:
        return _merged(layers)


def _merged(layers: list[dict[str, Any]] | tuple[dict[str, Any], ...]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for layer in layers:
        merged = merge_layers(merged, layer)
    return merged


def _label(value: Any) -> str:
    if isinstance(value, str | int | float | bool) or value is None:
        return str(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True).strip("{}[]").replace('"', "")


def _check_label(label: Any, path: Path, what: str = "variant name", folder: str = "a run folder") -> str:
    """A variant's name is a folder name under ``<out>/runs``, the study's under ``runs/studies``: refuse one that
    would leave it (``/``, ``\\``, ``..``, ``.``, empty) or break a terminal (control characters)."""
    bad = (not isinstance(label, str) or not label or "/" in label or "\\" in label or label in (".", "..")
           or label.startswith("..") or any(ord(c) < 32 or ord(c) == 127 for c in label))
    if bad:
        raise ConfigError(f"study file {path}: {what} {label!r} cannot name {folder} (a non-empty name without '/', "
                          "'\\', '..' or control characters)")
    return label


def _base(value: Any, path: Path) -> dict[str, Any]:
    """The study's base config: a file (relative to the study file) or an inline mapping of sections."""
    if isinstance(value, str):
        return load_yaml(extended(path, value))
    if isinstance(value, dict):
        inline = dict(value)
        parent = inline.pop("extends", None)
        return merge_layers(load_yaml(extended(path, parent)), inline) if parent is not None else inline
    raise ConfigError(f"study file {path}: 'base' must be a config file name or a mapping of config sections, got "
                      f"{value!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _seeds(value: Any, path: Path) -> list[int]:
    """``seeds:``: a non-empty list of distinct integers >= 0 (a float would be truncated, a repeated seed would
    count one run several times in the mean ± std)."""
    if not isinstance(value, list) or not value or not all(_is_int(seed) and seed >= 0 for seed in value):
        raise ConfigError(f"study file {path}: 'seeds' must be a non-empty list of integers >= 0 (e.g. [0, 1, 2]), "
                          f"got {value!r}")
    repeated = sorted({seed for seed in value if value.count(seed) > 1})
    if repeated:
        raise ConfigError(f"study file {path}: 'seeds' repeats {', '.join(map(str, repeated))}: each seed is one run, "
                          "a repeat would count it twice in the mean ± std")
    return list(value)


def _splits(value: Any, path: Path) -> int:
    """``splits:``: how many class-disjoint partitions, an integer >= 1."""
    if not _is_int(value) or value < 1:
        raise ConfigError(f"study file {path}: 'splits' must be a whole number of splits >= 1 (e.g. 10), got "
                          f"{value!r}")
    return value


def _split_fraction(value: Any, path: Path) -> float:
    """``split_fraction:``: the share of training classes that validate, in (0, 1)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise ConfigError(f"study file {path}: 'split_fraction' must be a number between 0 and 1 (the share of "
                          f"training classes that validate, e.g. 0.5), got {value!r}")
    return float(value)


def load_study(path: str | Path, command_line: list[dict[str, Any]] | tuple[dict[str, Any], ...] = (),
               settings: dict[str, Any] | None = None) -> StudySpec:
    """Read a study file, or the packaged study of that name (``demo``: ``deepmetric.presets``; a file that exists
    wins); ``command_line`` (config layers) and then ``settings`` (``key=value`` settings, dotted keys) apply to every
    run, over its settings."""
    path = resolve_preset(path, "study")
    try:
        data = read_yaml(path.read_text(), f"study file {path}") or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"study file {path} is not valid YAML: {' '.join(str(error).split())}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"study file {path} is not text (YAML in UTF-8)") from None
    except OSError as error:
        raise ConfigError(f"study file {path} cannot be read: {error.strerror or error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"study file {path} must hold a mapping")
    for key in data:
        if key not in KEYS:
            raise ConfigError(f"study file {path}: unknown key '{key}'{did_you_mean(str(key), KEYS)}")
    name = data.get("name", path.stem)
    name = _check_label(str(name) if isinstance(name, int | float) and not isinstance(name, bool) else name, path,
                        "study name", "a folder")
    base = _base(data["base"], path) if "base" in data else {}
    variants_given = data.get("variants") or {"": {}}
    if not isinstance(variants_given, dict):
        raise ConfigError(f"study file {path}: 'variants' must map each variant's name to its overrides, got "
                          f"{variants_given!r}")
    common = _dotted(data.get("set") or {}, "set", [base])
    named = {str(k): _dotted(v or {}, f"variants.{k}", [base, common]) for k, v in variants_given.items()}
    grid = data.get("grid") or {}
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise ConfigError(f"study file {path}: 'grid' must map config keys to non-empty lists")
    variants: dict[str, dict[str, Any]] = {}
    for variant, overrides in named.items():
        for combination in itertools.product(*grid.values()) if grid else [()]:
            cell = dict(zip(grid, combination, strict=True))
            label = "-".join(p for p in [variant, *(_label(v) for v in cell.values())] if p) or "base"
            cell_layer = _dotted(cell, "grid", [base, common, overrides])
            variants[_check_label(label, path)] = merge_layers(overrides, cell_layer)
    if "seeds" in data and "splits" in data:
        raise ConfigError(f"study file {path}: give 'seeds' or 'splits', not both")
    protocol = "splits" if "splits" in data else "seeds"
    repeats = list(range(_splits(data["splits"], path))) if protocol == "splits" else _seeds(data.get("seeds", [0]),
                                                                                               path)
    split_fraction = _split_fraction(data.get("split_fraction", 0.5), path)
    out = data.get("out", f"runs/studies/{name}")
    if not isinstance(out, str) or not out.strip():
        raise ConfigError(f"study file {path}: 'out' must be a folder's path, got {out!r}")
    all_embeddings = data.get("all_embeddings", False)
    if not isinstance(all_embeddings, bool):
        raise ConfigError(f"study file {path}: 'all_embeddings' must be true or false, got {all_embeddings!r}")
    record = data.get("record")
    record_dir = Path(record).expanduser() if isinstance(record, str) else None  # "~" in a file: the home folder
    if record is not None and (record_dir is None or record_dir.exists() and not record_dir.is_dir()):
        raise ConfigError(f"study file {path}: 'record' must be a folder, got {record!r}")
    compare = data.get("compare") or []
    compare = [compare] if isinstance(compare, str) else compare
    if not isinstance(compare, list) or not all(isinstance(name, str) for name in compare):
        raise ConfigError(f"study file {path}: 'compare' must be a variant's name or a list of them, got {compare!r}")
    for reference in compare:
        if reference not in variants:
            raise ConfigError(f"study file {path}: 'compare' names no variant {reference!r}"
                              + variant_hint(reference, variants))
    seed_validation = data.get("seed_validation", False)
    if not isinstance(seed_validation, bool) or seed_validation and protocol == "splits":
        raise ConfigError(f"study file {path}: 'seed_validation' must be true or false, and goes with seeds (splits "
                          f"draw their own validation classes already), got {seed_validation!r}")
    tune = parse_tune(data["tune"], path, list(variants)) if "tune" in data else None
    spec = StudySpec(name=name, base=base, out=Path(out).expanduser(),
                     common=common, variants=variants, repeats=repeats,
                     protocol=protocol, split_fraction=split_fraction,
                     all_embeddings=all_embeddings, overrides=_merged(command_line),
                     settings=dict(settings or {}),
                     record=record_dir, compare=compare, seed_validation=seed_validation, tune=tune)
    # a run whose config fails is reported and skipped by run_study; when every run fails, nothing starts
    failing: dict[str, ConfigError] = {}
    for run in spec.runs():
        try:
            build_config(*run.layers)
        except ConfigError as error:
            failing[run.name] = error
    if failing and len(failing) == len(spec.runs()):
        name, failure = next(iter(failing.items()))
        raise ConfigError(f"study file {path}, run {name}: {failure}")
    if tune is not None:
        _check_space(spec, tune, path)
    return spec


def _check_space(spec: StudySpec, tune: TuneSpec, path: Path) -> None:
    """Build a trial's config at each edge of every variant's space (and with every choice): a key that is no
    setting, or a value a setting refuses, stops the study when it is loaded rather than at a trial."""
    for variant, dimensions in tune.spaces.items():
        for dimension in dimensions:
            for value in dimension.bounds():
                try:
                    build_config(*spec.trial_layers(variant, {dimension.key: value}))
                except ConfigError as error:
                    raise ConfigError(f"study file {path}: tune dimension {dimension.key} = {value!r} (variant "
                                      f"{variant!r}): {error}") from None
