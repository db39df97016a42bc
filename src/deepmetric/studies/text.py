"""Text from a study's files (variant names, data set names, embedding names, machine names) as a cell of a Markdown
table: nothing a record holds may add a column, a link, emphasis or HTML to ``results.md``."""

from __future__ import annotations

from typing import Any

ESCAPED = {"\\": "\\\\", "|": "\\|", "*": "\\*", "_": "\\_", "`": "\\`", "[": "\\[", "]": "\\]", "#": "\\#",
           "<": "&lt;", ">": "&gt;", "&": "&amp;"}


def cell(value: Any) -> str:
    """``value`` as literal text in a Markdown table cell: the characters Markdown or HTML would read escaped, line
    breaks and other control characters as spaces."""
    text = "".join(" " if not ch.isprintable() else ch for ch in str(value))
    return "".join(ESCAPED.get(ch, ch) for ch in text)
