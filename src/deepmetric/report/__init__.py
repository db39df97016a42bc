"""``deepmetric report RUN_DIR``: one self-contained HTML page about a trained run."""

from .html import build_report

__all__ = ["build_report"]
