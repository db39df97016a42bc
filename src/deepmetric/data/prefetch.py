"""Batches made one ahead by a background thread: what keeps a GPU busy while ``data.cache`` makes the next batch.

The training loop waits for the GPU at the end of every step (it reads the loss), so a batch made when the loop asks
for it is made while the GPU waits: the per-sample draws on the host, then the augmentation's kernels. A thread that
makes batch i + 1 while the loop waits for step i hides that. Its kernels go to the device's current stream, the one
the training step uses (threads share it), so they run in the order they were launched, after the work already
queued and before the step that reads the batch, which the loop launches only once it has the batch: no stream
synchronisation is needed, and the batches are the same tensors, in the same order, as without the thread.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

_END = object()
_POLL_SECONDS = 0.1


def prefetched(items: Iterable[T], depth: int = 1) -> Iterator[T]:
    """``items`` in order, each made by a background thread while the caller uses the one before (at most ``depth``
    made ahead). An exception raised by ``items`` is raised here, after the items made before it; closing the
    iterator (or dropping it) stops the thread."""
    made: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(entry: tuple[object, BaseException | None]) -> bool:
        while not stop.is_set():
            try:
                made.put(entry, timeout=_POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    def make() -> None:
        try:
            for item in items:
                if not put((item, None)):
                    return
            put((_END, None))
        except BaseException as error:  # handed to the caller, raised there
            put((None, error))

    thread = threading.Thread(target=make, name="deepmetric-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item, error = made.get()
            if error is not None:
                raise error
            if item is _END:
                return
            yield item
    finally:
        stop.set()
        thread.join()
