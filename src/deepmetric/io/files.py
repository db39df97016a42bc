"""Writing files that must never be half-written: every module that writes a file a user keeps (checkpoints, configs,
metrics, reports, indexes, study tables) writes it through ``atomic_path``: a temporary file beside the target,
fsynced and renamed over it, so a crash at any moment leaves the old or the new file whole, with the mode a plain
``open`` gives. Also a folder replaced whole (``replace_folder``), a file opened without following a link
(``open_in_place``) and a file's SHA-256 (``file_sha256``)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..errors import DeepMetricError, WriteError

TEMPORARY_PREFIX, TEMPORARY_SUFFIX = ".", ".tmp"
"""An atomic write's temporary file is ``.<name>.<random>.tmp`` beside the target."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def temporary_folder(target: Path) -> Path:
    """A new folder beside ``target`` (``.<name>.<random>.tmp``) with the mode ``mkdir`` gives (``mkdtemp``
    makes it 0700), to be filled and renamed to ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f"{TEMPORARY_PREFIX}{target.name}.", suffix=TEMPORARY_SUFFIX,
                                   dir=target.parent))
    folder.chmod(0o777 & ~_umask())
    return folder


def fsync_dir(folder: Path) -> None:
    """fsync a folder so that a rename inside it survives a crash (best effort)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary file beside ``path`` for the caller to write; on success it is fsynced and renamed over
    ``path``, so ``path`` is always either its old or its new content; on failure it is removed."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f"{TEMPORARY_PREFIX}{path.name}.", suffix=TEMPORARY_SUFFIX, dir=path.parent)
    except OSError as error:
        raise WriteError(f"cannot write {path}: {error.strerror or error}") from None
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())  # the mode a plain open() gives (mkstemp makes 0600)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as error:  # a full disk, a folder gone read-only: the old file is intact
        Path(tmp).unlink(missing_ok=True)
        kept = "; the previous file is intact" if path.exists() else ""
        raise WriteError(f"could not write {path}: {error.strerror or error}{kept}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def open_in_place(path: Path, flags: int, error: type[DeepMetricError] = WriteError) -> int:
    """Open ``path`` for a file kept and written in place (a lock file, an appended log), not replaced by
    ``atomic_path``; returns the descriptor. A symbolic link there is not followed (``O_NOFOLLOW``): planted in a
    run or index folder, it made deepmetric truncate or append to the file it points to (or create the file a
    dangling link names). A FIFO or a device there is refused as well. Each refusal is one ``error`` naming the
    path. (Hard links are not refused: backups by ``rsync --link-dest`` or ``cp -al`` give every file of a run
    several; a hard link to a file its planter cannot write is refused by the kernel's ``protected_hardlinks``.)"""
    path = Path(path)
    try:  # O_NONBLOCK: a FIFO planted there is refused below instead of blocking the open
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o666)
    except OSError as failure:
        if failure.errno in (errno.ELOOP, errno.EMLINK) or path.is_symlink():
            raise error(f"{path} is a symbolic link; deepmetric does not follow links for the files it writes in "
                        "place (it would write to the file the link points to): remove the link") from None
        if failure.errno == errno.ENXIO:  # a FIFO without a reader, opened for writing
            raise error(f"{path} is not a regular file; remove it") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise error(f"{path} is not a regular file; remove it")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def refuse_folder(out: str | Path, example: str) -> None:
    """Refuse an output file given as a folder (one that exists, or a name ending in '/') before a suffix is added
    to it, which would write the hidden ``runs/x/.npy`` or the sibling ``models.onnx``; ``example`` is the file name
    the message suggests inside it."""
    if Path(out).is_dir() or str(out).endswith(("/", os.sep)):
        raise WriteError(f"{out} is a folder; give the file to write, e.g. {Path(out) / example}")


def check_writable(path: Path) -> None:
    """Refuse, before any long work, an output ``path`` whose folder cannot be written (or that is a folder)."""
    path = Path(path)
    if path.is_dir():
        raise WriteError(f"{path} is a folder; give a file name")
    blocking = next((folder for folder in path.parents if folder.exists() and not folder.is_dir()), None)
    if blocking is not None:  # mkdir would say only "File exists"
        raise WriteError(f"cannot write {path}: {blocking} is a file, not a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=f"{TEMPORARY_PREFIX}{path.name}.", suffix=TEMPORARY_SUFFIX,
                                     dir=path.parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as error:
        raise WriteError(f"cannot write {path}: {error.strerror or error}") from None


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (``atomic_path``)."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def _exchange(first: Path, second: Path) -> bool:
    """Swap two folders in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where the system cannot."""
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(first), at_fdcwd, os.fsencode(second), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):  # an old kernel, a file system without it
        return False
    raise OSError(code, os.strerror(code), str(second))


def replace_folder(target: Path, files: dict[str, bytes]) -> None:
    """Make the folder ``target`` hold exactly ``files`` (name -> bytes; names without folders): they are written
    into a new folder beside it, which then takes its place in one step (``renameat2``'s exchange, where Linux has
    it; elsewhere two renames), and the old folder is removed. A reader sees the old contents or the new, never a
    mixture (a file the new contents lack is gone with the old folder, not left beside the new files)."""
    import shutil

    target = Path(target)
    staging = temporary_folder(target)
    try:
        for name, data in files.items():
            if Path(name).name != name or name in ("", ".", ".."):
                raise WriteError(f"cannot write {target / name}: not a file name")
            with open(staging / name, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
        if not target.exists():
            os.rename(staging, target)
        elif not _exchange(staging, target):
            old = target.with_name(f"{TEMPORARY_PREFIX}{target.name}.{os.getpid()}-{os.urandom(4).hex()}"
                                   f"{TEMPORARY_SUFFIX}")
            os.rename(target, old)
            os.rename(staging, target)
            staging = old
        fsync_dir(target.parent)
    except OSError as error:
        raise WriteError(f"could not write {target}: {error.strerror or error}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # the new folder after a failure, or the old one after the swap


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of a file's bytes, read a megabyte at a time (checkpoints, packages, recorded files)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
