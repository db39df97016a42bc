"""Errors a user can cause, each carrying one clear message.

The CLI prints ``str(error)`` for these and exits with status 2, without a traceback. Anything else
that escapes is a bug in deepmetric and keeps its traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class DeepMetricError(Exception):
    """Base class of every error caused by user input (paths, layouts, configs, images)."""


class ConfigError(DeepMetricError):
    """A bad configuration key or value."""


class DataError(DeepMetricError):
    """A data set whose layout, table or images are not what the loader expects."""


class MissingDataPath(DataError):
    """A data spec's ``PATH`` that does not exist (``cub: no such folder: /data/CUB``)."""


class CheckpointError(DeepMetricError):
    """A missing, foreign or unsafe checkpoint file."""


class IndexStoreError(DeepMetricError):
    """A missing, foreign or incompatible retrieval index (``deepmetric index`` / ``search`` / ``serve``)."""


class WriteError(DeepMetricError):
    """A file could not be written (a full disk, a read-only folder); what was there before is intact."""


class TrainingError(DeepMetricError):
    """Training cannot go on (e.g. a non-finite loss); the message names the step and the term."""


class RunInUse(DeepMetricError):
    """Another process holds the run folder (its ``.lock``): a second training into it is refused; a study leaves
    the run to that process."""

    def __init__(self, message: str, holder: str):
        super().__init__(message)
        self.holder = holder


class TrainingInterrupted(DeepMetricError):
    """A signal stopped training after a checkpoint was written."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum


class UploadError(DeepMetricError):
    """An uploaded query image the service refuses; ``status`` is the HTTP status to answer with (4xx)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """Return ``" (did you mean 'x'?)"`` for the closest choice, or ``""`` when none is close; letter case does not
    count (``DGML``: ``dgml``)."""
    by_lower: dict[str, str] = {}
    for choice in choices:
        by_lower.setdefault(str(choice).lower(), str(choice))
    close = difflib.get_close_matches(str(word).lower(), list(by_lower), n=1, cutoff=0.5)
    return f" (did you mean '{by_lower[close[0]]}'?)" if close else ""
