"""``DATASETS``, the table of data set loaders by spec name, and what each one's ``PATH`` must be (``PATH_KINDS``);
each loader registers itself at its function (``@register_dataset("cub", "folder")``), a variant beside it
(``cub-cropped``: the loader with ``crop=True``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import DataError
from ..registry import Registry
from .table import RetrievalTable

DATASETS: Registry[Callable[..., RetrievalTable]] = Registry(
    "data set", provided=("path", "seed", "check", "skip_bad"), error=DataError)
"""Loaders by spec name: ``loader(path, seed=, check=, skip_bad=)`` (each takes those it uses); a loader
whose ``path`` has no default needs ``NAME:PATH``."""
PATH_KINDS: dict[str, str] = {}
"""What each loader's ``PATH`` must be: ``folder``, ``file``, ``built`` (a folder the loader creates) or ``none`` (it
reads no path); the last two are not checked. A loader registered without one needs its ``PATH`` to exist, file or
folder."""


def register_dataset(name: str, kind: str, loader: Callable[..., RetrievalTable] | None = None) -> Any:
    """Register ``loader`` as data set ``name`` whose ``PATH`` is of ``kind`` (``PATH_KINDS``); without ``loader``, a
    decorator that registers what it decorates."""
    if loader is None:
        return lambda decorated: register_dataset(name, kind, decorated)
    DATASETS.register(name, loader)
    PATH_KINDS[name] = kind
    return loader
