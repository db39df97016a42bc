"""Stop training cleanly on SIGINT/SIGTERM: finish the current step, write ``last``, exit.

A second signal while the first is being handled stops at once (KeyboardInterrupt), as a user pressing
Ctrl-C twice expects. Handlers are only installed from the main thread (Python allows no other).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class StopRequest:
    signum: int | None = None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""


@contextmanager
def stop_on_signals(signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[StopRequest]:
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def handler(signum: int, frame: object) -> None:
        if request.signum is not None:
            raise KeyboardInterrupt
        request.signum = signum

    previous = {s: signal.getsignal(s) for s in signals}
    for s in signals:
        signal.signal(s, handler)
    try:
        yield request
    finally:
        for s, old in previous.items():
            signal.signal(s, old)
