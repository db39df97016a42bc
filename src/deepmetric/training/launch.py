"""``deepmetric train --nproc N``: run N training processes on this machine under torch.distributed.

The same as ``torchrun --nproc-per-node N -m deepmetric train ...`` without torchrun: each process gets the
rendezvous environment (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``) and calls
``train``; the CPU cores are split between the processes unless ``train.threads`` says otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from ..config import config_from_dict
from ..distributed import free_port
from ..errors import DeepMetricError


def _worker(rank: int, world: int, port: int, config: dict[str, Any], out: str, resume: bool, progress: bool) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    resolved = config_from_dict(config)
    if not resolved.train.threads:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    from ..distributed import shutdown
    from .trainer import train

    try:
        train(resolved, out, resume=resume, progress=progress and rank == 0)
    finally:
        shutdown()


def launch(config: Any, out: str | Path, nproc: int, resume: bool = False, progress: bool = True) -> None:
    """Train with ``nproc`` local processes; a worker's user error comes back as one DeepMetricError."""
    if nproc < 1:
        raise DeepMetricError(f"--nproc must be at least 1, got {nproc}")
    try:
        mp.spawn(_worker, args=(nproc, free_port(), config.to_dict(), str(out), resume, progress), nprocs=nproc,
                 join=True)
    except mp.ProcessRaisedException as error:
        lines = [line for line in str(error).splitlines() if line.strip()]
        raise DeepMetricError(f"a training process failed: {lines[-1] if lines else error}") from None
