"""Training: the loop, the optimiser groups and the checkpoint format."""

from .trainer import TrainingError, TrainingInterrupted, TrainResult, build_model, load_table, train

__all__ = ["TrainResult", "TrainingError", "TrainingInterrupted", "build_model", "load_table", "train"]
