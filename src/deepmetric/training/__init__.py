"""Training: the loop, the optimiser groups, the untrained baseline (it writes the run format, ``deepmetric.runs``).

The loop's parts, for a loop of your own (docs/own-loop.md): ``seed_everything``, ``build_model``, ``load_table``,
``initialize_head``, ``build_optimizer``, ``apply_schedule`` and ``selection_key`` are what ``train`` calls.
"""

from ..errors import TrainingError, TrainingInterrupted
from ..runs.table import load_table
from .optim import apply_schedule, build_optimizer
from .selection import selection_key
from .session import initialize_head
from .setup import build_model, seed_everything
from .trainer import TrainResult, train

__all__ = ["TrainResult", "TrainingError", "TrainingInterrupted", "apply_schedule", "build_model", "build_optimizer",
           "initialize_head", "load_table", "seed_everything", "selection_key", "train"]
