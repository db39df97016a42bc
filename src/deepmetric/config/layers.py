"""Config layers before they are typed: YAML files (with ``extends:``), ``key=value`` overrides, and their merge."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError
from ..presets import resolve as resolve_preset


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
