"""A trained model from a run's checkpoint: the model spec a checkpoint carries, checked before anything is
allocated, and the weights loaded into the model it describes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..config import RunConfig
from ..config.validate import model_spec_config
from ..errors import CheckpointError, DeepMetricError
from ..io.tensors import unprefixed
from ..models import Embedder
from ..models.embedder import build_plan, plan_model
from .checkpoint import load_checkpoint
from .folder import RunDir

MODEL_SPEC_KEYS = {"backbone", "head", "embedding_dim", "split", "freeze_bn", "head_options"}
"""What ``Embedder.spec`` holds: the arguments of ``create_model`` that rebuild the architecture."""


def model_from_checkpoint(path: Path, device: str | torch.device = "cpu") -> tuple[Embedder, dict[str, Any]]:
    """Rebuild the ``Embedder`` described by a checkpoint's spec and load its weights."""
    tensors, state = load_checkpoint(path)
    return model_from_tensors(tensors, state, path, device), state


def model_from_tensors(tensors: dict[str, torch.Tensor], state: dict[str, Any], path: Path,
                       device: str | torch.device = "cpu") -> Embedder:
    """``model_from_checkpoint`` for a checkpoint already read (``path`` only names it in errors)."""
    spec = state.get("model_spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("head_options", {}), dict):
        raise CheckpointError(f"{path} has no model_spec describing its model (a damaged or hand-edited header)")
    unknown = sorted(set(spec) - MODEL_SPEC_KEYS)
    if unknown:
        raise CheckpointError(f"{path}: its model_spec has unknown key(s) {unknown}; expected "
                              f"{', '.join(sorted(MODEL_SPEC_KEYS))}")
    weights = unprefixed("model", tensors)
    damaged = [name for name, value in weights.items() if value.is_floating_point() and not value.isfinite().all()]
    if damaged:
        raise CheckpointError(f"{path} holds NaN or infinite weights ({len(damaged)} tensors, e.g. {damaged[0]})")
    plan = planned_model(spec, path)
    expected = {name: tuple(value.shape) for name, value in plan.state_dict().items()}
    missing = [name for name in expected if name not in weights]
    unexpected = [name for name in weights if name not in expected]
    if missing or unexpected:
        raise CheckpointError(f"{path} does not fit the model it describes: missing {missing[:5]}, unexpected "
                              f"{unexpected[:5]}")
    misshapen = [f"{name} {tuple(weights[name].shape)} (expected {shape})" for name, shape in expected.items()
                 if tuple(weights[name].shape) != shape]
    if misshapen:  # found on the plan, before the model's memory is allocated
        raise CheckpointError(f"{path} does not fit the model it describes: {len(misshapen)} tensor(s) of another "
                              f"shape, e.g. {misshapen[0]}")
    model = build_plan(plan)
    model.load_state_dict(weights)
    return model.to(device).eval()


def planned_model(spec: dict[str, Any], path: Path) -> Embedder:
    """The model a checkpoint's ``model_spec`` describes, on the meta device (``plan_model``), once the spec is typed
    and checked as the config's ``model`` section (``model_spec_config``): a crafted header can ask for no option the
    head does not declare (``weights``, ``trust_pickle``), no value of another type or out of bounds, and no model
    above ``MAX_MODEL_VALUES``. Each refusal is one ``CheckpointError`` naming the file."""
    try:
        model = model_spec_config(spec)
        return plan_model(model.backbone, model.head, model.embedding_dim, model.split, model.freeze_bn,
                          **model.head_options)
    except DeepMetricError as error:
        raise CheckpointError(f"{path}: its model_spec describes no model deepmetric builds: {error}") from None
    except (TypeError, ValueError, RuntimeError) as error:  # a head option out of the head's range
        raise CheckpointError(f"{path}: its model_spec describes no model deepmetric builds: "
                              f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}") from None


def load_run_checkpoint(run_dir: str | Path, which: str = "auto", device: str | torch.device = "cpu"
                        ) -> tuple[Embedder, RunConfig, Path, dict[str, torch.Tensor], dict[str, Any]]:
    """``load_run_model`` that also returns the checkpoint's tensors and state (e.g. the objective's), read once."""
    run = RunDir(run_dir)
    config = run.config()
    path = run.checkpoint(which)
    tensors, state = load_checkpoint(path)
    model = model_from_tensors(tensors, state, path, device).set_channels_last(config.train.channels_last)
    return model, config, path, tensors, state


def load_run_model(run_dir: str | Path, which: str = "auto",
                   device: str | torch.device = "cpu") -> tuple[Embedder, RunConfig, Path]:
    """A run's model from its checkpoint ``which`` (``auto``, ``best`` or ``last``), its config and the file."""
    model, config, path, _, _ = load_run_checkpoint(run_dir, which, device)
    return model, config, path
