"""Checkpoints: one safetensors file of tensors with the JSON state in its header, written atomically.

A checkpoint holds ``model.*`` tensors, and for ``last`` also ``optim.*`` (Adam's moments) and
``rng.*`` (torch's generator states); everything else (step, optimiser hyper-parameters, the model's
architecture spec, best score) is JSON in the safetensors metadata. Nothing is pickled, so loading a
checkpoint never executes code. Files are written through ``deepmetric.io.files.atomic_path`` (a temporary file
in the same folder, fsynced and renamed over the old one), so a crash at any moment leaves either the old or
the new checkpoint whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file as load_safetensors_file
from safetensors.torch import save_file as save_safetensors_file

from ..errors import CheckpointError
from ..io.files import atomic_path
from ..io.strict import MalformedFile, load_json, to_json
from ..models.weights import file_start, is_pickled

FORMAT = "deepmetric-checkpoint-1"


def save_checkpoint(path: Path, tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
    """Save ``tensors`` with ``state`` as JSON metadata, written straight from the tensors' memory to the
    temporary file: no copy of the checkpoint is held in memory (a model with HORDE's 69 M objective
    parameters checkpoints 0.8 GB). Tensors are moved to the CPU and made contiguous; a tensor sharing memory
    with another one (which safetensors refuses) is copied."""
    plain, seen = {}, set()
    for key, value in tensors.items():
        value = value.detach().to("cpu").contiguous()
        storage = value.untyped_storage().data_ptr()
        plain[key] = value.clone() if storage in seen and value.numel() else value
        seen.add(storage)
    header = {"format": FORMAT, "state": to_json(state)}
    with atomic_path(Path(path)) as tmp:
        try:
            save_safetensors_file(plain, tmp, metadata=header)
        except SafetensorError as error:  # safetensors reports a full disk as its own error, not an OSError
            raise OSError(str(error)) from None


def _refuse_pickle(path: Path, start: bytes) -> None:
    if is_pickled(start):
        raise CheckpointError(f"refusing to load {path}: it is a pickled torch file, and unpickling can execute "
                              "arbitrary code. deepmetric checkpoints are safetensors files.")


def _state(path: Path, metadata: dict[str, str]) -> dict[str, Any]:
    if metadata.get("format") != FORMAT:
        raise CheckpointError(f"{path} is a safetensors file but not a deepmetric checkpoint "
                              f"(format {metadata.get('format')!r})")
    if not isinstance(metadata.get("state"), str):
        raise CheckpointError(f"{path} has a damaged header: its 'state' is missing")
    try:
        state = load_json(metadata["state"])
    except MalformedFile as error:
        raise CheckpointError(f"{path} has a damaged header: its 'state' is not the JSON deepmetric writes "
                              f"({error})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} has a damaged header: its 'state' is not a JSON object")
    return state


def load_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read a checkpoint written by ``save_checkpoint``; refuses pickles and foreign files by name (from the
    header, before any tensor is read). The tensors are read from the file into their own memory, without a
    copy of the whole file in between."""
    state = checkpoint_state(path)
    try:
        tensors = load_safetensors_file(path)
    except (SafetensorError, ValueError, OSError) as error:
        raise CheckpointError(f"{path} is not a readable safetensors checkpoint: {error}") from None
    return tensors, state


def checkpoint_state(path: Path) -> dict[str, Any]:
    """The JSON state of a checkpoint from its header alone, without reading its tensors (a run's checkpoint
    with HORDE's parameters is 0.3-0.9 GB)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    start = file_start(path)
    _refuse_pickle(path, start)
    try:
        metadata = load_json(start[8:]).get("__metadata__", {}) or {}
    except (MalformedFile, AttributeError) as error:
        raise CheckpointError(f"{path} is not a readable safetensors checkpoint: {error}") from None
    if not isinstance(metadata, dict):
        raise CheckpointError(f"{path} is not a readable safetensors checkpoint: its __metadata__ is not an object")
    return _state(path, metadata)


