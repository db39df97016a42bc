"""``deepmetric <command>``: parses arguments, builds the config, calls the library. Nothing else.

Errors a user can cause are printed as one line (``error: ...``) with exit status 2.
"""

from __future__ import annotations

import logging
import os
import sys

from ..errors import DeepMetricError, TrainingInterrupted
from .commands import check_paths, printable
from .parser import build_parser, take_trailing_positional

__all__ = ["build_parser", "main"]


class PrintableFormatter(logging.Formatter):
    """Log records as text with control characters escaped (``printable``): a file name holding an escape
    sequence, quoted in a warning, must not drive the terminal."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # key=value overrides may sit anywhere among the flags of `train` and `study`
    stray = [a for a in extra if a.startswith("-") or "=" not in a or args.command not in ("train", "study")]
    if stray:
        parser.error(f"unrecognized arguments: {printable(' '.join(stray))}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    take_trailing_positional(args)
    quiet = getattr(args, "quiet", False) or getattr(args, "json", False)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(PrintableFormatter("%(message)s"))  # log lines quote file names: escape what they hold
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, handlers=[handler])
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # which SIMD build it loaded: noise for users
    try:
        check_paths(args)  # a mistyped path named before the model code is imported
        return args.func(args)
    except TrainingInterrupted as stopped:
        print(printable(str(stopped)), file=sys.stderr)
        return 128 + stopped.signum
    except DeepMetricError as error:
        print(f"error: {printable(str(error))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`deepmetric presets | head`): stop quietly, as cat does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush of stdout must not fail again
        return 141
