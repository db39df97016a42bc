"""Whether a finished run or tuning trial is the one a study would train now: its saved ``config.yaml`` against the
config the study builds, setting by setting, leaving out what cannot change a result (``NOT_COMPARED``) and reading a
regulariser's options with their defaults written out (``regularizer_options``: ``{horde: {weight: 0.2}}`` and the
same with HORDE's default orders, dimension and mode given are one run)."""

from __future__ import annotations

from typing import Any

from ..config import RunConfig
from ..errors import DeepMetricError
from ..losses import regularizer_options
from ..runs.folder import RunDir, flat_settings

NOT_COMPARED = ("data.num_workers", "data.pin_memory", "train.threads", "train.device", "train.tensorboard",
                "train.compile", "eval.batch_size", "eval.report")
"""Settings that cannot change what a finished run measured (loader processes, threads, which CPU or GPU it ran
on, compiled or not, evaluation batch size, the report page): a finished run whose saved config differs from the
study's only in these is still reused. ``train.device`` is here so that one study runs on several GPUs (a process
each, with ``train.device=cuda:N``) and across machines; each run's ``environment.json`` names its device."""


def changed_settings(folder: RunDir, config: RunConfig) -> list[str]:
    """The settings (``key: saved -> now``) in which ``folder``'s saved ``config.yaml`` differs from ``config``;
    ``[]`` when the finished run is the one the study would train now."""
    try:
        saved = flat_settings(_with_defaults(folder.config().to_dict()))
    except DeepMetricError as error:
        return [f"its config.yaml cannot be read: {error}"]
    now = flat_settings(_with_defaults(config.to_dict()))
    return [f"{key}: {saved.get(key, '(none)')} -> {now.get(key, '(none)')}" for key in sorted(set(saved) | set(now))
            if key not in NOT_COMPARED and saved.get(key) != now.get(key)]


def _with_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (``RunConfig.to_dict()``) with each regulariser's options completed by their defaults."""
    loss = config.get("loss") or {}
    regularizers = loss.get("regularizers")
    if not isinstance(regularizers, dict):
        return config
    completed = {}
    for name, options in regularizers.items():
        try:
            completed[name] = {key: list(value) if isinstance(value, tuple) else value  # as YAML reads it back
                               for key, value in regularizer_options(name, options).items()}
        except DeepMetricError:  # a plug-in not registered here: compared as written
            completed[name] = options
    return {**config, "loss": {**loss, "regularizers": completed}}
