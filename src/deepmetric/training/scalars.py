"""TensorBoard scalars (``train.tensorboard: true``, the extra ``deepmetric[tensorboard]``): what ``metrics.jsonl``
logs, also written as event files to ``RUN/tensorboard/`` with ``torch.utils.tensorboard``, as PML's logging presets
do. ``metrics.jsonl`` and the HTML report are unchanged; the event files are a view for TensorBoard.

Tags: ``loss/total`` and ``loss/<term>`` (the objective's terms, unweighted), ``lr/<group>`` (every optimiser group),
``speed/images_per_s``, ``val/<metric>``, and with ``train.amp=fp16`` ``amp/skipped_steps`` and ``amp/loss_scale``.
A resumed session purges the events after its checkpoint's step, which the killed session may have written, as the
log is truncated there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..config import check_tensorboard
from ..errors import DeepMetricError
from ..runs.folder import AMP_LOG_KEYS


class TensorBoardScalars:
    """Writes the training log's records as TensorBoard scalars into ``folder``."""

    def __init__(self, folder: Path, start_step: int = 0):
        check_tensorboard()
        if folder.is_symlink() or folder.exists() and not folder.is_dir():
            raise DeepMetricError(f"{folder} is not a folder (a file or a link is there): train.tensorboard writes "
                                  "its events into that folder; move it away, or set train.tensorboard=false")
        from torch.utils.tensorboard import SummaryWriter

        # events of steps after the checkpoint (start_step), which a killed session may have written, are dropped
        self.writer = SummaryWriter(str(folder), purge_step=start_step + 1 if start_step else None)

    def training(self, record: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
        """A training record of ``metrics.jsonl`` (``step``, ``loss``, the terms, ``images_per_s``) and the rate of
        every optimiser group at that step."""
        step = record["step"]
        self.writer.add_scalar("loss/total", record["loss"], step)
        for key, value in record.items():
            if key in AMP_LOG_KEYS:
                self.writer.add_scalar(f"amp/{key}", value, step)
            elif key not in ("step", "loss", "lr", "images_per_s"):
                self.writer.add_scalar(f"loss/{key}", value, step)
        for group in optimizer.param_groups:
            self.writer.add_scalar(f"lr/{group.get('name', 'group')}", group["lr"], step)
        self.writer.add_scalar("speed/images_per_s", record["images_per_s"], step)

    def validation(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(f"val/{key}", value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
