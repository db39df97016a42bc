"""The bottom of the house: writing files that must never be half-written, strict JSON, flat tensor dicts.

Every module that writes a file a user keeps (checkpoints, configs, metrics, reports, indexes, study tables)
writes it through ``atomic_path``: a temporary file beside the target, fsynced and renamed over it, so a
crash at any moment leaves the old or the new file whole, with the mode a plain ``open`` gives. Every
machine-readable output is RFC 8259 JSON (``to_json``): Python's ``json`` writes ``NaN`` and ``Infinity``,
which ``jq``, browsers' ``JSON.parse`` and strict parsers refuse; an undefined value is ``null``.
Checkpoints hold several state dicts in one flat safetensors file (``prefixed``/``unprefixed``, and
``optimizer_to_flat`` for an optimiser's state). Every JSON or YAML file read back (a checkpoint's header, a run's
``config.yaml``, ``metrics.jsonl``, ``metrics.json``, ``environment.json``, an index's ``index.json``, config files)
is read through ``load_json`` / ``load_yaml``, which answer a malformed file with one ``MalformedFile`` (a
``ValueError``) saying why, never a ``RecursionError`` or a silently dropped key.

Nothing here imports the rest of deepmetric: every floor may use it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import math
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import DeepMetricError, WriteError

if TYPE_CHECKING:
    import torch
    import yaml

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


def prefixed(prefix: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``{"<prefix>.<name>": tensor}``: several state dicts in one flat checkpoint."""
    return {f"{prefix}.{k}": v for k, v in tensors.items()}


def unprefixed(prefix: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors of ``prefixed(prefix, ...)``, with their own names."""
    start = len(prefix) + 1
    return {k[start:]: v for k, v in tensors.items() if k.startswith(prefix + ".")}


def optimizer_to_flat(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split ``optimizer.state_dict()`` into tensors (``{param}.{key}``) and JSON (groups, scalars)."""
    state_dict = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, values in state_dict["state"].items():
        for key, value in values.items():
            if hasattr(value, "dtype") and hasattr(value, "shape"):  # a tensor
                tensors[f"{index}.{key}"] = value
            else:
                scalars[f"{index}.{key}"] = value
    return tensors, {"param_groups": state_dict["param_groups"], "scalars": scalars}


def optimizer_from_flat(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor],
                        meta: dict[str, Any]) -> None:
    """Load what ``optimizer_to_flat`` split back into ``optimizer``."""
    state: dict[int, dict[str, Any]] = {}
    for name, value in list(tensors.items()) + list(meta["scalars"].items()):
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = value
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def finite_or_none(value: Any) -> Any:
    """``value`` with every NaN or infinite float (in lists, tuples and dicts too) replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_none(v) for v in value]
    return value


def to_json(value: Any, **options: Any) -> str:
    """``json.dumps`` that writes strict JSON: non-finite floats become ``null`` (``options`` as json.dumps')."""
    return json.dumps(finite_or_none(value), allow_nan=False, **options)


MAX_NESTING = 100
"""Deepest nesting of lists and mappings a JSON or YAML file read back may hold. deepmetric writes at most 6 levels;
100,000 nested brackets made Python's JSON reader and PyYAML raise ``RecursionError``, and data nested just below
their limit would make any later recursive walk over it do so."""
MAX_YAML_NODES = 20_000
"""Most values a YAML file may hold once its aliases are expanded. A config file holds a few hundred; an alias bomb
(each anchor referring to the previous one nine times: 243 bytes) holds billions, and printing, merging or checking
it ran for minutes and printed megabytes."""


TOO_DEEP = f"it nests too deeply (more than {MAX_NESTING} levels of lists or mappings)"


class MalformedFile(ValueError):
    """A JSON or YAML text that is not valid, nests too deeply, repeats a key (YAML) or expands too far (YAML
    aliases); its message says which (``it nests too deeply ...``), and ``naming(file)`` says it of the file."""

    def naming(self, source: object) -> str:
        """The message about ``source``: ``config.yaml nests too deeply (...)``."""
        return f"{source} {str(self).removeprefix('it ')}"


class NotParsable(MalformedFile):
    """A text that is not JSON (or not YAML) at all, as opposed to one too deep, too large or with a repeated key."""


def nesting_depth(value: Any, limit: int = MAX_NESTING) -> int:
    """How deeply lists, tuples and mappings nest in ``value`` (a scalar: 0), without recursion; stops past
    ``limit`` (a value that contains itself is endlessly deep). Shared parts are walked each time they are used: call
    it on parsed JSON, or on YAML whose ``expanded_size`` is bounded."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, dict | list | tuple):
            continue
        if depth > limit:
            return depth
        deepest = max(deepest, depth)
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list | tuple))
    return deepest


def _check_nesting(value: Any) -> Any:
    if nesting_depth(value) > MAX_NESTING:
        raise MalformedFile(TOO_DEEP)
    return value


def load_json(data: str | bytes) -> Any:
    """``json.loads`` for a file deepmetric reads back: a ``MalformedFile`` (a ``ValueError``) for text that is
    not JSON or not UTF-8, and for nesting deeper than ``MAX_NESTING`` (100,000 brackets raised ``RecursionError``
    inside the reader)."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise MalformedFile(TOO_DEEP) from None
    except UnicodeDecodeError as error:
        raise NotParsable(f"it is not UTF-8 text ({error.reason} at byte {error.start})") from None
    except ValueError as error:
        raise NotParsable(f"it is not valid JSON: {error}") from None
    return _check_nesting(value)


def read_json_object(path: str | Path, error: type[DeepMetricError] = DeepMetricError) -> dict[str, Any]:
    """The JSON object in file ``path`` (``load_json``): one ``error`` naming the file when it cannot be read, is
    not JSON, nests too deeply or holds something else than an object."""
    try:
        record = load_json(Path(path).read_bytes())
    except MalformedFile as failure:
        raise error(f"{path} is not the JSON deepmetric writes ({failure})") from None
    except OSError as failure:
        raise error(f"{path} cannot be read: {failure.strerror or failure}") from None
    if not isinstance(record, dict):
        raise error(f"{path} is not the JSON deepmetric writes (a {type(record).__name__}, not an object)")
    return record


def expanded_size(value: Any, limit: int = MAX_YAML_NODES) -> int:
    """How many values ``value`` holds with every shared (aliased) part counted each time it is used, computed in
    time linear in the distinct objects (each one's size is remembered), stopping past ``limit``; a value that
    contains itself (``&a [*a]``) counts as past the limit."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()

    def size(item: Any) -> int:
        if not isinstance(item, dict | list):
            return 1
        key = id(item)
        if key in sizes:
            return sizes[key]
        if key in open_:
            return limit + 1
        open_.add(key)
        children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
        total = 1
        for child in children:
            total += size(child)
            if total > limit:
                break
        open_.discard(key)
        sizes[key] = total
        return total

    return size(value)


@functools.cache
def _strict_loader() -> type[yaml.SafeLoader]:
    """PyYAML's safe loader, refusing a key repeated in one mapping (PyYAML keeps the last silently: a config with
    two ``train:`` sections lost the first one's settings without a word)."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # '<<: *base' merges, by design
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.setdefault(key, line)
                except TypeError:  # an unhashable key: PyYAML's own error says so below
                    continue
                if first != line:
                    raise MalformedFile(f"it repeats the key {key!r} in one mapping (lines {first} and {line}); "
                                        "YAML would keep only the last one, silently: merge them into one")
            return super().construct_mapping(node, deep=deep)

    return StrictLoader


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` for a file deepmetric reads (configs, a run's ``config.yaml``, study files): a
    ``MalformedFile`` for text that is not YAML, a key repeated in one mapping, nesting deeper than
    ``MAX_NESTING``, or more than ``MAX_YAML_NODES`` values once its aliases are expanded (or one containing
    itself)."""
    import yaml

    try:
        value = yaml.load(text, Loader=_strict_loader())  # a SafeLoader: no Python objects
    except RecursionError:
        raise MalformedFile(TOO_DEEP) from None
    except yaml.YAMLError as error:
        raise NotParsable(f"it is not valid YAML: {' '.join(str(error).split())}") from None
    try:  # first, as it counts each shared part once: nesting_depth walks an alias bomb's billions of values
        size = expanded_size(value)
    except RecursionError:
        raise MalformedFile(TOO_DEEP) from None
    if size > MAX_YAML_NODES:
        raise MalformedFile(f"it expands to more than {MAX_YAML_NODES:,} values through its YAML aliases "
                            "(&anchor / *alias), or contains itself; a config holds a few hundred")
    return _check_nesting(value)


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of a file's bytes, read a megabyte at a time (checkpoints, packages, recorded files)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
