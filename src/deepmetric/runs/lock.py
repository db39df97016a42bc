"""A run folder held by one process: an exclusive ``flock`` on ``RUN/.lock`` (a second training into the same
``--out`` is refused naming the holder's PID), nesting within ``holding`` for a sequence of steps."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from ..errors import DeepMetricError, RunInUse
from ..io.files import open_in_place

_HELD_HERE: set[str] = set()
"""Run folders this process holds through ``holding`` (real paths): a claim on one of them nests, where flock
would refuse a second open file of the same process."""


def holder(lock_path: Path) -> str | None:
    """The PID of the process that holds this folder now (``claimed``), or None when it is free. A look only:
    the lock is not kept, so the folder may be taken a moment later (``claimed`` still refuses then)."""
    try:  # not through a symbolic link (``claimed`` refuses one, naming it)
        handle = os.fdopen(open_in_place(lock_path, os.O_RDONLY))
    except (OSError, DeepMetricError):
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return handle.read().strip() or "?"
        fcntl.flock(handle, fcntl.LOCK_UN)
        return None


@contextlib.contextmanager
def claimed(folder: Path, lock_path: Path, log_path: Path) -> Iterator[None]:
    """Hold the run folder for this process: an exclusive ``flock`` on ``RUN/.lock``, released when the
    process ends or dies. A second training into the same folder is refused naming the holder's PID (two
    trainings into one ``--out`` both ran and interleaved their logs, configs and checkpoints). The lock file is
    opened without following a symbolic link (one planted there had the file it points to overwritten with the
    PID): a link or a FIFO there is refused, naming it. Inside ``holding`` by this process, a claim nests."""
    if os.path.realpath(folder) in _HELD_HERE:
        yield
        return
    if folder.exists() and not folder.is_dir():
        raise DeepMetricError(f"{folder} is a file, not a run folder; choose another --out")
    real = folder.resolve()  # '..' and links resolved: the folders removed below are the ones made here
    created = [made for made in (real, *real.parents) if not made.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle = os.fdopen(open_in_place(lock_path, os.O_RDWR | os.O_CREAT | os.O_APPEND), "a+")
    except OSError as error:
        raise DeepMetricError(f"cannot write to {folder}: {error.strerror or error}") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "?"
        handle.close()
        raise RunInUse(f"{folder} is in use by another training (process {holder}); wait for it to end or "
                       "choose another --out", holder) from None
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        if os.path.lexists(log_path):  # the log is appended in place: a link there is refused now,
            os.close(open_in_place(log_path, os.O_WRONLY | os.O_APPEND))  # not after a first step
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()
        if [f.name for f in folder.iterdir()] == [lock_path.name]:  # nothing written: leave no folder
            lock_path.unlink()
            for made in created:  # deepest first
                made.rmdir()


@contextlib.contextmanager
def holding(folder: Path, lock_path: Path, log_path: Path) -> Iterator[None]:
    """``claimed`` for a sequence of steps on one run (a study: training, then its evaluation), within which
    the steps' own claims (``train``'s) nest instead of being refused: the folder is never free in between,
    so another process cannot resume or evaluate the run a second time."""
    key = os.path.realpath(folder)
    with claimed(folder, lock_path, log_path):
        _HELD_HERE.add(key)
        try:
            yield
        finally:
            _HELD_HERE.discard(key)

