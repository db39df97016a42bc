"""``HEADS``, the table of heads by name: each ``Head`` subclass registers itself at its class
(``@HEADS.register("gap")``); ``deepmetric.models.heads`` imports every head module, so the table is full once the
package is imported."""

from __future__ import annotations

from ...registry import Registry
from .base import Head

HEADS: Registry[type[Head]] = Registry("head", options_of=lambda cls: cls.option_names())
