"""Training: the loop, the optimiser groups, the untrained baseline (it writes the run format, ``deepmetric.runs``)."""

from ..runs.table import load_table
from .setup import build_model
from .trainer import TrainingError, TrainingInterrupted, TrainResult, train

__all__ = ["TrainResult", "TrainingError", "TrainingInterrupted", "build_model", "load_table", "train"]
