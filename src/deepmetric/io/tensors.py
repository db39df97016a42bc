"""Flat tensor dicts: checkpoints hold several state dicts in one flat safetensors file (``prefixed`` /
``unprefixed``), and an optimiser's state as tensors and a JSON-able rest (``optimizer_to_flat`` /
``optimizer_from_flat``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def prefixed(prefix: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``{"<prefix>.<name>": tensor}``: several state dicts in one flat checkpoint."""
    return {f"{prefix}.{k}": v for k, v in tensors.items()}


def unprefixed(prefix: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors of ``prefixed(prefix, ...)``, with their own names."""
    start = len(prefix) + 1
    return {k[start:]: v for k, v in tensors.items() if k.startswith(prefix + ".")}


def optimizer_to_flat(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split ``optimizer.state_dict()`` into tensors (``{param}.{key}``) and JSON (groups, scalars)."""
    state_dict = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, values in state_dict["state"].items():
        for key, value in values.items():
            if hasattr(value, "dtype") and hasattr(value, "shape"):  # a tensor
                tensors[f"{index}.{key}"] = value
            else:
                scalars[f"{index}.{key}"] = value
    return tensors, {"param_groups": state_dict["param_groups"], "scalars": scalars}


def optimizer_from_flat(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor],
                        meta: dict[str, Any]) -> None:
    """Load what ``optimizer_to_flat`` split back into ``optimizer``."""
    state: dict[int, dict[str, Any]] = {}
    for name, value in list(tensors.items()) + list(meta["scalars"].items()):
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = value
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
