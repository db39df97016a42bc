"""``GENERATORS``, the table of example generators by name; each ``Generator`` subclass registers itself at its class
(``@GENERATORS.register("mirage")``)."""

from __future__ import annotations

from ..registry import Registry
from .base import PROVIDED, Generator

GENERATORS: Registry[type[Generator]] = Registry("generator", provided=PROVIDED,
                                                  options_of=lambda cls: cls.option_names())
