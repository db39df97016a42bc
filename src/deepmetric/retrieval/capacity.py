"""What bounds the service's work: the gate in front of its searches (``Busy`` beyond it: a 503) and the cache of
gallery thumbnails."""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any


class Busy(Exception):
    """The gate is full (503)."""


class Gate:
    """At most ``workers`` jobs run at once in a thread pool, at most ``queue`` more wait; each waited for at
    most ``timeout_s``. A job that overruns keeps its slot until it really ends, so the bound always holds."""

    def __init__(self, workers: int, queue: int, timeout_s: float):
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="deepmetric-search")
        self.capacity = workers + queue
        self.timeout_s = timeout_s
        self.pending = 0  # only touched on the event loop's thread

    def _finished(self, future: asyncio.Future) -> None:
        self.pending -= 1
        if not future.cancelled():
            future.exception()  # retrieved, so an overrun job's error is not reported as unretrieved

    async def run(self, job: Any, *args: Any) -> Any:
        if self.pending >= self.capacity:
            raise Busy(f"the service is busy ({self.pending} requests in progress); retry shortly")
        self.pending += 1
        future = asyncio.get_running_loop().run_in_executor(self.executor, job, *args)
        future.add_done_callback(self._finished)
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.timeout_s)
        except TimeoutError:
            raise Busy(f"the request took longer than {self.timeout_s:g} s; retry later") from None

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


class ThumbnailCache:
    """Thread-safe LRU of thumbnail bytes by item id."""

    def __init__(self, size: int):
        self.size = size
        self.items: OrderedDict[int, bytes] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: int) -> bytes | None:
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                return self.items[key]
        return None

    def put(self, key: int, value: bytes) -> None:
        with self.lock:
            self.items[key] = value
            self.items.move_to_end(key)
            while len(self.items) > self.size:
                self.items.popitem(last=False)
