"""``deepmetric <command>``: parses arguments, builds the config, calls the library. Nothing else.

Errors a user can cause are printed as one line (``error: ...``) with exit status 2.
"""

from __future__ import annotations

import logging
import sys

from ..errors import DeepMetricError, TrainingInterrupted
from .commands import printable
from .parser import build_parser

__all__ = ["build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # key=value overrides may sit anywhere among the flags of `train` and `study`
    stray = [a for a in extra if a.startswith("-") or "=" not in a or args.command not in ("train", "study")]
    if stray:
        parser.error(f"unrecognized arguments: {printable(' '.join(stray))}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    quiet = getattr(args, "quiet", False) or getattr(args, "json", False)
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # which SIMD build it loaded: noise for users
    try:
        return args.func(args)
    except TrainingInterrupted as stopped:
        print(str(stopped), file=sys.stderr)
        return 128 + stopped.signum
    except DeepMetricError as error:
        print(f"error: {printable(str(error))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
