"""A tuning study's search space: the ``tune:`` section of a study file, checked, and each dimension's suggestion.

```yaml
tune:
  trials: 12                 # trials per variant: the same budget for every variant (the Musgrave et al. rule)
  seed: 0                    # the TPE sampler's seed (one sampler per variant)
  objective: map@r           # what a trial scores: recall@1, map@r or r_precision on the validation classes, at
                             #   the checkpoint the library selects (best validation Recall@1, ties by MAP@R)
  space:                     # shared knobs, searched for every variant
    train.lr: {low: 1.0e-4, high: 3.0e-3, log: true}
    loss.options.negative_weight: {low: 15, high: 45}          # two integers: an integer dimension
  variants:                  # each method's own knobs, added to the shared ones
    deml: {loss.regularizers.deml-hinge.weight: {low: 0.05, high: 1.0, log: true}}
    diablo: {model.head_options.alpha: {choices: [1.0, 3.0, 10.0, 30.0]}}
```

A dimension is ``{low, high}`` (integers when both are integers and no float ``step`` is given; ``log: true`` for a
log-uniform scale, ``step`` for a grid) or ``{choices: [...]}`` (numbers, strings, booleans). ``1e-4`` written without
a dot is a string to YAML; it is read as the number it spells.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, did_you_mean

OBJECTIVES = ("recall@1", "map@r", "r_precision")
TUNE_KEYS = ("trials", "seed", "objective", "space", "variants")
DIMENSION_KEYS = ("low", "high", "log", "step", "choices")


@dataclass(frozen=True)
class Dimension:
    """One searched config key (dotted, as in ``set:``): a range ``[low, high]`` (integers or floats, ``log`` scale,
    ``step`` grid) or a list of ``choices``."""

    key: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple[Any, ...] | None = None

    @property
    def is_int(self) -> bool:
        return self.choices is None and all(isinstance(v, int) for v in (self.low, self.high)) and (
            self.step is None or isinstance(self.step, int))

    def suggest(self, trial: Any) -> Any:
        """The value an Optuna ``trial`` proposes for this key (registered under the key's name)."""
        if self.choices is not None:
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.is_int:
            return trial.suggest_int(self.key, self.low, self.high, step=self.step or 1, log=self.log)
        assert self.low is not None and self.high is not None  # a range: _dimension sets both when there are no choices
        return trial.suggest_float(self.key, float(self.low), float(self.high), step=self.step, log=self.log)

    def bounds(self) -> list[Any]:
        """The values at the edges of the space (checked to build a config when the study is loaded)."""
        return list(self.choices) if self.choices is not None else [self.low, self.high]

    def describe(self) -> str:
        if self.choices is not None:
            return "{" + ", ".join(map(str, self.choices)) + "}"
        scale = ", log" if self.log else ""
        step = f", step {self.step}" if self.step is not None else ""
        return f"[{self.low}, {self.high}{scale}{step}]"


@dataclass(frozen=True)
class TuneSpec:
    """The ``tune:`` section: trials per variant, the sampler's seed, the objective, each variant's dimensions."""

    trials: int
    seed: int
    objective: str
    spaces: dict[str, tuple[Dimension, ...]]


def _number(value: Any) -> float | int | None:
    """A YAML number, or a string that spells one (``1e-4``: YAML 1.1 reads it as text); None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    return None


def _dimension(key: Any, value: Any, where: str) -> Dimension:
    if not isinstance(key, str) or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"{where}: {key!r} is not a config key (a dotted name such as train.lr)")
    label = f"{where}.{key}"
    if not isinstance(value, dict):
        raise ConfigError(f"{label} must be a range {{low: A, high: B}} (log: true, step: S) or {{choices: [...]}}, "
                          f"got {value!r}")
    for name in value:
        if name not in DIMENSION_KEYS:
            raise ConfigError(f"{label}: unknown key {name!r}{did_you_mean(str(name), DIMENSION_KEYS)} (a dimension "
                              "has low, high, log, step, or choices)")
    if "choices" in value:
        choices = value["choices"]
        if set(value) != {"choices"}:
            raise ConfigError(f"{label}: choices stand alone (no low, high, log or step beside them)")
        if not isinstance(choices, list) or not choices or not all(
                isinstance(c, str | bool | int | float) and (not isinstance(c, float) or math.isfinite(c))
                for c in choices):
            raise ConfigError(f"{label}.choices must be a non-empty list of numbers, strings or booleans, got "
                              f"{choices!r}")
        if len(set(map(repr, choices))) != len(choices):
            raise ConfigError(f"{label}.choices repeats a value: {choices!r}")
        return Dimension(key, choices=tuple(choices))
    if "low" not in value or "high" not in value:
        raise ConfigError(f"{label} needs both low and high (or choices), got {value!r}")
    low, high, step = _number(value["low"]), _number(value["high"]), value.get("step")
    if low is None or high is None or not low < high:
        raise ConfigError(f"{label}: low and high must be finite numbers with low < high, got {value['low']!r} and "
                          f"{value['high']!r}")
    log = value.get("log", False)
    if not isinstance(log, bool):
        raise ConfigError(f"{label}.log must be true or false, got {log!r}")
    if log and low <= 0:
        raise ConfigError(f"{label}: a log scale needs low > 0, got {low}")
    if step is not None:
        step = _number(step)
        if step is None or step <= 0:
            raise ConfigError(f"{label}.step must be a positive number, got {value['step']!r}")
        if log:
            raise ConfigError(f"{label}: give log or step, not both (Optuna samples one or the other)")
    if isinstance(value["low"], str) or isinstance(value["high"], str):  # spelled as text: floats
        low, high = float(low), float(high)
    return Dimension(key, low=low, high=high, log=log, step=step)


def _space(mapping: Any, where: str) -> tuple[Dimension, ...]:
    if not isinstance(mapping, dict):
        raise ConfigError(f"{where} must map config keys to dimensions, got {mapping!r}")
    return tuple(_dimension(key, value, where) for key, value in mapping.items())


def parse_tune(value: Any, path: Path, variants: list[str]) -> TuneSpec:
    """The study file's ``tune:`` section, every key checked (``path`` names the file in messages); ``variants``
    are the study's variant names (``tune.variants`` may name only those)."""
    where = f"study file {path}: tune"
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping (trials, seed, objective, space, variants), got {value!r}")
    for key in value:
        if key not in TUNE_KEYS:
            raise ConfigError(f"{where}: unknown key {key!r}{did_you_mean(str(key), TUNE_KEYS)}")
    trials = value.get("trials")
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise ConfigError(f"{where}.trials must be a whole number of trials per variant >= 1, got {trials!r}")
    seed = value.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32:
        raise ConfigError(f"{where}.seed must be an integer from 0 to 2^32 - 1, got {seed!r}")
    objective = value.get("objective", "recall@1")
    if objective not in OBJECTIVES:
        raise ConfigError(f"{where}.objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}"
                          + did_you_mean(str(objective), OBJECTIVES))
    shared = _space(value.get("space") or {}, f"{where}.space")
    own = value.get("variants") or {}
    if not isinstance(own, dict):
        raise ConfigError(f"{where}.variants must map variant names to their own dimensions, got {own!r}")
    for name in own:
        if name not in variants:
            raise ConfigError(f"{where}.variants names no variant {name!r}{did_you_mean(str(name), variants)} (its "
                              f"variants: {', '.join(variants)})")
    spaces = {}
    for name in variants:
        dimensions = shared + _space(own.get(name) or {}, f"{where}.variants.{name}")
        repeated = sorted({d.key for d in dimensions if [e.key for e in dimensions].count(d.key) > 1})
        if repeated:
            raise ConfigError(f"{where}: variant {name!r} searches {', '.join(repeated)} twice (in space and in its "
                              "own dimensions)")
        if not dimensions:
            raise ConfigError(f"{where}: variant {name!r} has nothing to search (tune.space and tune.variants."
                              f"{name} are empty)")
        spaces[name] = dimensions
    return TuneSpec(trials=trials, seed=seed, objective=objective, spaces=spaces)
