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
seeds: [0, 1, 2]                  # repeat every variant with train.seed = s
splits: 10                        # or the DIABLO protocol (§4.2): s = 0..9 class-disjoint train/val partitions
split_fraction: 0.5               #   of the training classes (half validate), model selection on validation
all_embeddings: true              # also `evaluate --all-embeddings` every run (ABE's learners and their mean ±
                                  #   std, DeML's scales, HORDE's orders and †): results-all-embeddings.{csv,md}
compare: [gap]                    # optional: results.md also gives each variant's difference from these
                                  #   variants' means, marked where the ±1 std intervals do not overlap
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

from ..config import build_config, extended, load_yaml, merge_layers, nest
from ..errors import ConfigError, did_you_mean
from ..presets import resolve as resolve_preset

KEYS = ("name", "base", "out", "record", "set", "variants", "grid", "seeds", "splits", "split_fraction",
        "all_embeddings", "compare")


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
    """``key=value`` overrides from the command line, over every variant's settings."""
    record: Path | None = None
    """Where each finished run's small files are kept as well (``studies.record``), or none."""
    compare: list[str] = field(default_factory=list)
    """The reference variants each variant is set against in ``results.md`` (``aggregate.comparison``)."""

    def run_dir(self, run: StudyRun) -> Path:
        """Where ``run`` trains: ``<out>/runs/<variant>/<repeat>``."""
        return self.out / "runs" / run.variant / str(run.repeat)

    def record_dir(self, run: StudyRun) -> Path | None:
        """Where ``run``'s record is kept: ``<record>/<variant>/<repeat>``, or none without a record."""
        return None if self.record is None else self.record / run.variant / str(run.repeat)

    def runs(self) -> list[StudyRun]:
        """Every run, repeat by repeat (all variants of the first seed or split come first, so a study stopped
        early already compares every variant)."""
        runs = []
        for repeat in self.repeats:
            for variant, overrides in self.variants.items():
                if self.protocol == "splits":
                    per_repeat = {"data": {"val_fraction": self.split_fraction, "val_seed": repeat}}
                else:
                    per_repeat = {"train": {"seed": repeat}}
                runs.append(StudyRun(variant, repeat, [self.base, self.common, overrides, self.overrides,
                                                       per_repeat]))
        return runs


def variant_hint(name: str, variants: dict[str, Any]) -> str:
    """What follows "no variant <name>" in an error: the nearest variant's name and the whole list."""
    return f"{did_you_mean(name, variants)} (its variants: {', '.join(variants)})"


def _dotted(mapping: dict[str, Any], where: str) -> dict[str, Any]:
    """``{"train.steps": 3}`` -> ``{"train": {"steps": 3}}`` (values kept as given)."""
    if not isinstance(mapping, dict):
        raise ConfigError(f"study: '{where}' must be a mapping of config keys, got {mapping!r}")
    nested: dict[str, Any] = {}
    for key, value in mapping.items():
        nested = merge_layers(nested, nest(str(key), value))
    return nested


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


def load_study(path: str | Path, command_line: list[dict[str, Any]] | tuple[dict[str, Any], ...] = ()) -> StudySpec:
    """Read a study file, or the packaged study of that name (``demo``: ``deepmetric.presets``; a file that exists
    wins); ``command_line`` (parsed ``key=value`` layers) apply to every run, over its settings."""
    path = resolve_preset(path, "study")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"study file {path} must hold a mapping")
    for key in data:
        if key not in KEYS:
            raise ConfigError(f"study file {path}: unknown key '{key}'{did_you_mean(key, KEYS)}")
    name = data.get("name", path.stem)
    name = _check_label(str(name) if isinstance(name, int | float) and not isinstance(name, bool) else name, path,
                        "study name", "a folder")
    base = _base(data["base"], path) if "base" in data else {}
    named = {str(k): _dotted(v or {}, f"variants.{k}") for k, v in (data.get("variants") or {"": {}}).items()}
    grid = data.get("grid") or {}
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise ConfigError(f"study file {path}: 'grid' must map config keys to non-empty lists")
    variants: dict[str, dict[str, Any]] = {}
    for variant, overrides in named.items():
        for combination in itertools.product(*grid.values()) if grid else [()]:
            cell = dict(zip(grid, combination, strict=True))
            label = "-".join(p for p in [variant, *(_label(v) for v in cell.values())] if p) or "base"
            variants[_check_label(label, path)] = merge_layers(overrides, _dotted(cell, "grid"))
    if "seeds" in data and "splits" in data:
        raise ConfigError(f"study file {path}: give 'seeds' or 'splits', not both")
    protocol = "splits" if "splits" in data else "seeds"
    repeats = list(range(int(data["splits"]))) if protocol == "splits" else [int(s) for s in data.get("seeds", [0])]
    all_embeddings = data.get("all_embeddings", False)
    if not isinstance(all_embeddings, bool):
        raise ConfigError(f"study file {path}: 'all_embeddings' must be true or false, got {all_embeddings!r}")
    record = data.get("record")
    if record is not None and (not isinstance(record, str) or Path(record).exists() and not Path(record).is_dir()):
        raise ConfigError(f"study file {path}: 'record' must be a folder, got {record!r}")
    compare = data.get("compare") or []
    compare = [compare] if isinstance(compare, str) else compare
    if not isinstance(compare, list) or not all(isinstance(name, str) for name in compare):
        raise ConfigError(f"study file {path}: 'compare' must be a variant's name or a list of them, got {compare!r}")
    for reference in compare:
        if reference not in variants:
            raise ConfigError(f"study file {path}: 'compare' names no variant {reference!r}"
                              + variant_hint(reference, variants))
    spec = StudySpec(name=name, base=base, out=Path(data.get("out", f"runs/studies/{name}")),
                     common=_dotted(data.get("set") or {}, "set"), variants=variants, repeats=repeats,
                     protocol=protocol, split_fraction=float(data.get("split_fraction", 0.5)),
                     all_embeddings=all_embeddings, overrides=_merged(command_line),
                     record=Path(record) if record is not None else None, compare=compare)
    for run in spec.runs():  # every run's config must be valid before anything starts
        try:
            build_config(*run.layers)
        except ConfigError as error:
            raise ConfigError(f"study file {path}, run {run.name}: {error}") from None
    return spec
