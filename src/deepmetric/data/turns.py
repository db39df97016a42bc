"""Two processes building the same data set at once (two trainings started together) take turns on a lock file beside
its folder (``$DEEPMETRIC_DATA/.<name>.lock``): the second waits, saying so, and then finds the first one's build
instead of building it again (``taking_turns``: ``download``, the icons build, and the emoji and glyphs loaders when
they build). The lock is an ``flock``: it holds between processes of one machine, and between machines only on a
shared file system whose ``flock`` reaches across them (NFS does; Lustre only when mounted with ``flock``)."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from ..errors import DataError

log = logging.getLogger("deepmetric")


def unwritable(name: str, folder: Path, error: OSError) -> DataError:
    """The error for a data folder this process cannot write, with the ways out."""
    return DataError(f"{name}: cannot write to {folder}: {error.strerror or error}; set DEEPMETRIC_DATA to a folder "
                     f"you can write, or download it yourself and use --data {name}:PATH")


@contextlib.contextmanager
def taking_turns(lock: Path, name: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock`` (waiting, with a warning, while another process holds it); the file
    is removed on the way out. A waiter that wakes on a file already removed opens the new one and waits again."""
    while True:
        try:
            handle = open(lock, "a+b")  # noqa: SIM115 (held until the block ends)
        except OSError as error:
            raise unwritable(name, lock.parent, error) from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("%s: another process is fetching it into %s; waiting for it to finish", name, lock.parent)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            current = os.stat(lock).st_ino == os.fstat(handle.fileno()).st_ino
        except FileNotFoundError:
            current = False
        if current:
            break
        handle.close()
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)
        handle.close()
