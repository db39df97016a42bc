"""Values into the typed config: each ``key: value`` coerced to its section's declared type, or refused with the
key named and the nearest valid key suggested."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any

from ..errors import ConfigError, did_you_mean
from .sections import RunConfig


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


def coerce_float(value: Any, key: str) -> float:
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


SCALARS = {bool: _coerce_bool, int: _coerce_int, float: coerce_float, str: _coerce_str}
"""How a YAML value becomes each scalar type of the config."""


def _coerce_union(value: Any, args: tuple[Any, ...], annotation: Any, key: str) -> Any:
    if value is None and type(None) in args:
        return None
    for arg in args:
        if arg is type(None):
            continue
        try:
            return coerce(value, arg, key)
        except ConfigError:
            continue
    raise ConfigError(f"config key '{key}': {value!r} is not a valid {annotation}")


def _coerce_sequence(value: Any, origin: Any, args: tuple[Any, ...], key: str) -> list[Any] | tuple[Any, ...]:
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    fixed = origin is tuple and bool(args) and args[-1] is not Ellipsis
    wanted = f"a list of {len(args)} values" if fixed else "a list"
    if not isinstance(value, list | tuple) or (fixed and len(value) != len(args)):
        raise ConfigError(f"config key '{key}': expected {wanted}, got {value!r}")
    if fixed:
        return tuple(coerce(v, a, key) for v, a in zip(value, args, strict=True))
    item_type = args[0] if args else Any
    coerced = [coerce(v, item_type, key) for v in value]
    return tuple(coerced) if origin is tuple else coerced


def coerce(value: Any, annotation: Any, key: str) -> Any:
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


_BATCH = "a batch is data.classes_per_batch x data.samples_per_class (P x K) images"
OTHER_TOOLS_KEYS = {"batch": _BATCH, "batch_size": _BATCH,
                    "epochs": "training is counted in train.steps (P x K batches), not epochs"}
"""Keys users bring from other training tools (matched by their last part), and what deepmetric calls them."""


def _unknown_key_hint(full: str, key: str, choices: list[str]) -> str:
    """A hint for an unknown key: what deepmetric calls a familiar setting; else the keys of that name in another
    section (``lr``, ``model.lr``: ``train.lr``; ``seed``: ``data.seed`` or ``train.seed``); else the closest key."""
    if key in OTHER_TOOLS_KEYS:
        return f" ({OTHER_TOOLS_KEYS[key]})"
    same_name = list(dict.fromkeys(c for c in choices if c.rsplit(".", 1)[-1] == key and c != full))
    if same_name:
        return f" (did you mean {' or '.join(repr(c) for c in same_name)}?)"
    return did_you_mean(full, choices)


def apply_values(target: Any, values: dict[str, Any], prefix: str = "") -> None:
    hints = typing.get_type_hints(type(target))
    names = [f.name for f in dataclasses.fields(target)]
    for key, value in values.items():
        full = f"{prefix}{key}"
        if key not in names:
            valid = [f"{prefix}{n}" for n in names]
            raise ConfigError(f"unknown config key '{full}'{_unknown_key_hint(full, key, valid + _all_keys())}")
        current = getattr(target, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"config key '{full}' is a section; expected a mapping, got {value!r}")
            apply_values(current, value, prefix=f"{full}.")
        elif hints[key] == dict[str, Any] and isinstance(value, dict) and isinstance(current, dict):
            merged = dict(current)
            merged.update(value)
            setattr(target, key, merged)
        else:
            setattr(target, key, coerce(value, hints[key], full))


def _all_keys() -> list[str]:
    keys = []
    defaults = RunConfig()
    for section in dataclasses.fields(defaults):
        for f in dataclasses.fields(getattr(defaults, section.name)):
            keys.append(f"{section.name}.{f.name}")
    return keys
