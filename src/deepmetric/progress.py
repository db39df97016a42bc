"""Progress bars that suit where they are written: tqdm's bar on a terminal, plain lines in a log.

Off a terminal (a file, ``nohup``, CI) a tqdm bar is a stream of carriage-return fragments: a 300-step run wrote
thousands of them into one log line. There each update is written as its own line instead, at most every
``LOG_INTERVAL_S`` seconds (tqdm's ``mininterval``) and without the bar graphic, so a log reads like
``training: 150/300 [01:02<01:02, 2.41step/s, loss=0.0812]``.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterable, Iterator
from typing import IO, Any

from tqdm import tqdm

LOG_INTERVAL_S = 30.0
LOG_FORMAT = "{desc}: {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"


class _Lines:
    """A text stream for tqdm that turns its carriage-return redraws into one line per update."""

    def __init__(self, stream: IO[str]):
        self.stream = stream

    def write(self, text: str) -> None:
        line = text.replace("\r", "").rstrip()
        if line:
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


def progress_bar(iterable: Iterable[Any] | None = None, **options: Any) -> tqdm:
    """``tqdm(iterable, **options)`` on a terminal; a line every ``LOG_INTERVAL_S`` seconds elsewhere."""
    stream = options.pop("file", None) or sys.stderr
    if hasattr(stream, "isatty") and stream.isatty():
        return tqdm(iterable, file=stream, **options)
    options.update(mininterval=LOG_INTERVAL_S, bar_format=LOG_FORMAT, dynamic_ncols=False, ascii=True)
    return tqdm(iterable, file=_Lines(stream), **options)


class _LogLines:
    """A text stream whose lines become ``logger`` records: what a third-party library prints on its own."""

    def __init__(self, logger: logging.Logger, level: int):
        self.logger, self.level, self.pending = logger, level, ""

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).replace("\r", "\n").split("\n")
        for line in lines:
            if line.strip():
                self.logger.log(self.level, "%s", line.rstrip())
        return len(text)

    def flush(self) -> None:
        if self.pending.strip():
            self.logger.log(self.level, "%s", self.pending.rstrip())
        self.pending = ""

    def isatty(self) -> bool:
        return False


@contextlib.contextmanager
def stdout_to_log(logger: str = "deepmetric", level: int = logging.INFO) -> Iterator[None]:
    """Send what Python code prints on standard output inside the block (torchvision's download messages, ...) to
    ``logger``: the library never writes on standard output, which belongs to the program that uses it (a
    ``--json`` answer, a pipe)."""
    stream = _LogLines(logging.getLogger(logger), level)
    try:
        with contextlib.redirect_stdout(stream):
            yield
    finally:
        stream.flush()

