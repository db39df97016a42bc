"""Training: the loop, the optimiser groups and the checkpoint format."""

from .setup import build_model, load_table
from .trainer import TrainingError, TrainingInterrupted, TrainResult, train

__all__ = ["TrainResult", "TrainingError", "TrainingInterrupted", "build_model", "load_table", "train"]
