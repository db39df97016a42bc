"""The run configuration: every knob of a run in one typed tree, loaded from YAML and ``key=value``.

A run is reproducible from its resolved config (saved as ``config.yaml`` in the run directory) and
its seed. Unknown keys are rejected with the nearest valid key suggested; values are coerced to the
declared type or rejected with the key named.

``sections.py`` declares the tree, ``layers.py`` reads YAML files and ``key=value`` overrides and merges them,
``values.py`` types each value into the tree, ``validate.py`` checks what needs more than one value; this module
puts them together (``build_config``) and saves a resolved config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .layers import extended, load_yaml, merge_layers, nest, parse_override
from .sections import (
    LR_SCHEDULES,
    DataConfig,
    EvalConfig,
    GeneratorConfig,
    LossConfig,
    MemoryConfig,
    ModelConfig,
    RunConfig,
    TrainConfig,
)
from .validate import check_tensorboard, validate
from .values import apply_values

__all__ = ["LR_SCHEDULES", "DataConfig", "EvalConfig", "GeneratorConfig", "LossConfig", "MemoryConfig", "ModelConfig",
           "RunConfig", "TrainConfig", "build_config", "check_tensorboard", "config_from_dict", "extended", "load_yaml",
           "merge_layers", "nest", "parse_override", "save_config", "validate"]


def build_config(*layers: dict[str, Any]) -> RunConfig:
    """Defaults, then each layer (YAML file, CLI flags, key=value overrides) in order."""
    config = RunConfig()
    for layer in layers:
        apply_values(config, layer)
    validate(config)
    return config


def config_from_dict(data: dict[str, Any]) -> RunConfig:
    """Rebuild a resolved config (e.g. a run directory's ``config.yaml``)."""
    return build_config(data)


def save_config(config: RunConfig, path: str | Path) -> None:
    from ..io.files import atomic_write_text

    atomic_write_text(Path(path), yaml.safe_dump(config.to_dict(), sort_keys=False))
