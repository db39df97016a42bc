"""Config layers before they are typed: YAML files (with ``extends:``), ``key=value`` overrides, and their merge."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..io.strict import MalformedFile, NotParsable
from ..io.strict import load_yaml as load_yaml_text
from ..presets import resolve as resolve_preset
from .sections import RunConfig

SECTIONS = (*(f.name for f in dataclasses.fields(RunConfig)), "extends")
"""The top-level keys a config file may hold."""

MAX_EXTENDS = 32
"""Most files one chain of ``extends:`` may read."""


def read_yaml(text: str, source: str) -> Any:
    """``deepmetric.io.strict.load_yaml`` of ``text`` (named ``source`` in messages): a ``ConfigError`` for invalid
    YAML, a key repeated in one mapping, nesting deeper than ``MAX_NESTING``, or more than ``MAX_YAML_NODES`` values
    once its aliases are expanded."""
    try:
        return load_yaml_text(text)
    except MalformedFile as error:
        raise ConfigError(error.naming(source)) from None


def nest(dotted: str, value: Any) -> dict[str, Any]:
    """``nest("train.lr", 1e-4)`` -> ``{"train": {"lr": 0.0001}}``."""
    parts = dotted.split(".")
    nested: dict[str, Any] = {parts[-1]: value}
    for part in reversed(parts[:-1]):
        nested = {part: nested}
    return nested


def dotted_layer(values: dict[str, Any], resolved: dict[str, Any]) -> dict[str, Any]:
    """The layer that sets each dotted key of ``values`` and nothing else, over a config that the earlier layers
    resolved to ``resolved`` (``RunConfig.to_dict()``).

    A setting is ``section.name``. A key deeper than that (``loss.regularizers.deml-hinge.weight``,
    ``model.head_options.alpha``) names one value inside a mapping setting; since a layer replaces a setting such as
    ``loss.regularizers`` whole, the layer carries that setting as ``resolved`` has it, with the value changed: the
    other regularisers and the other options of this one are kept. ``nest`` alone would drop them."""
    layer: dict[str, Any] = {}
    for key, value in values.items():
        parts = str(key).split(".")
        if len(parts) > 2:
            section, name = parts[0], parts[1]
            within = layer.get(section, {}).get(name) if isinstance(layer.get(section), dict) else None
            if not isinstance(within, dict):
                before = resolved.get(section)
                within = before.get(name) if isinstance(before, dict) else None
            if isinstance(within, dict):
                key, value = f"{section}.{name}", merge_layers(within, nest(".".join(parts[2:]), value))
        layer = merge_layers(layer, nest(str(key), value))
    return layer


def parse_override(text: str) -> dict[str, Any]:
    """``'train.lr=1e-4'`` -> ``{'train': {'lr': 0.0001}}`` (the value is read as YAML)."""
    return nest(*parse_setting(text))


def parse_settings(texts: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``['train.lr=1e-4', 'data.image_size=64']`` -> ``{'train.lr': 0.0001, 'data.image_size': 64}``, in order (the
    last of a key given twice wins); ``dotted_layer`` makes them a layer."""
    settings: dict[str, Any] = {}
    for text in texts:
        key, value = parse_setting(text)
        settings.pop(key, None)
        settings[key] = value
    return settings


def parse_setting(text: str) -> tuple[str, Any]:
    """``'train.lr=1e-4'`` -> ``('train.lr', 0.0001)`` (the value is read as YAML)."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' is not of the form key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override '{text}' has an empty key")
    try:
        value = load_yaml_text(raw) if raw.strip() else ""
    except NotParsable:  # read as text: train.device=cuda:0 [sic]
        value = raw
    except MalformedFile as error:
        raise ConfigError(error.naming(f"override '{key}'")) from None
    return key, value


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
    if len(_seen) >= MAX_EXTENDS:
        raise ConfigError(f"config file {_seen[0]}: its extends: chain is longer than {MAX_EXTENDS} files "
                          f"(reached {path})")
    try:
        data = read_yaml(path.read_text(), f"config file {path}")
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not text (YAML in UTF-8)") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections, got {type(data).__name__}")
    if data and not any(key in SECTIONS for key in data):  # not a config at all: quote nothing of it
        raise ConfigError(f"{path} is not a deepmetric config: none of its top-level keys is a section "
                          f"({', '.join(SECTIONS)}); each setting sits under its section, e.g. 'train:' then "
                          "'  lr: 0.001' on the next line")
    parent = data.pop("extends", None)
    if parent is None:
        return data
    return merge_layers(load_yaml(extended(path, parent), (*_seen, path.resolve())), data)


def extended(path: Path, parent: Any) -> Path:
    """The file that ``extends: parent`` in ``path`` names: relative to ``path``'s folder (``base`` there is
    ``base.yaml`` or ``base.yml`` when no file is named ``base``), else a packaged preset; never a file of the working
    directory (``extends: base`` read ``./base.yaml`` of wherever the command ran)."""
    if not isinstance(parent, str) or not parent.strip():
        raise ConfigError(f"config file {path}: 'extends' must name a YAML file or a preset, got {parent!r}")
    return resolve_preset(parent, "config", what=f"{path}: extends", relative_to=path.parent)
