"""Fetching a benchmark's official archive when its spec names no path (``--data cub``).

Only CUB-200-2011 is fetched: its publisher, Caltech's data repository, serves the original archive
(``ARCHIVES``: its URL, its published MD5 and its size, in one table that tests point at a local server). The
archive is downloaded to ``$DEEPMETRIC_DATA/CUB_200_2011.tgz.part`` with a progress bar on standard error; a cut
download resumes where it stopped (an HTTP ``Range`` request), in the same call (``ATTEMPTS``) or the next one. The
complete file is checked against the published MD5 (a mismatch deletes it), unpacked into a temporary folder beside
``$DEEPMETRIC_DATA/cub``, its layout checked (``images.txt``, ``image_class_labels.txt``, ``images/``), a
``meta.json`` marker written, and only then renamed to ``$DEEPMETRIC_DATA/cub``: a folder without the marker, or
with another archive's, is never taken as built. The archive is deleted once unpacked.

Nothing the project did not create is deleted or replaced: a ``$DEEPMETRIC_DATA/cub`` without the marker (a user's
own folder), a symbolic link there that does not lead to a build, or a ``CUB_200_2011.tgz`` beside it that is not the
published archive is refused with one message naming it, before anything is downloaded (``_check_ours``); only a
folder with the project's marker (a build of another archive, or one whose files were removed since) is replaced.

Two processes fetching the same data set at once (two trainings started together) take turns on
``$DEEPMETRIC_DATA/.cub.lock``: the second waits, saying so, and then uses the first one's build instead of appending a
second download to the same ``.part`` (``turns.taking_turns``).

What a server sends is bounded before it is written: a ``Content-Length`` beyond the published size is refused before
the first byte, and a body streamed without one is cut at the published size (a server streaming without a length
wrote 31.5 MB for a 1.3 kB archive, all before the MD5 check); the unpacked files are bounded by the table's
``max_unpacked`` bytes and ``max_files`` entries, summed from the tar headers before each file is written (a 293 kB
archive became 300 MB).

Cars-196, Stanford Online Products and In-Shop are not fetched: their official hosts no longer serve the archives
reliably, and copies elsewhere are not the publishers'. ``MANUAL`` says where the official files are and the layout
``NAME:PATH`` must have; ``parse_spec`` gives it when such a spec has no path.
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import json
import logging
import os
import shutil
import tarfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ..errors import DataError
from ..io.files import fsync_dir, temporary_folder
from .glyphs import data_home
from .turns import taking_turns, unwritable

FORMAT_VERSION = 1
TIMEOUT_S = 60.0
"""Seconds a connection or a read may stall before the attempt counts as cut."""
ATTEMPTS = 3
"""Downloads tried in one call, each resuming where the previous one stopped."""
RETRY_WAIT_S = 5.0
CHUNK = 1 << 20
log = logging.getLogger("deepmetric")


@dataclass(frozen=True)
class Archive:
    """One publisher's archive: where it is, its published MD5, its size in bytes, the folder it unpacks to and
    what that folder must hold (files, and folders ending in ``/``)."""

    url: str
    md5: str
    size: int
    page: str
    folder: str
    expected: tuple[str, ...]
    max_unpacked: int
    """Most bytes its files may hold once unpacked: what the published archive holds, with room to spare."""
    max_files: int
    """Most entries (files, folders, links) it may unpack."""

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[-1].split("?", 1)[0]


ARCHIVES: dict[str, Archive] = {
    "cub": Archive(
        url="https://data.caltech.edu/records/65de6-vp158/files/CUB_200_2011.tgz",
        md5="97eceeb196236b17998738112f37df78", size=1_150_585_339,
        page="https://data.caltech.edu/records/65de6-vp158", folder="CUB_200_2011",
        expected=("images.txt", "image_class_labels.txt", "images/"),
        # 11,788 JPEGs (which gzip does not shrink) and a few text files in about 12,000 entries: it unpacks to
        # about its own size; 2 GB and 50,000 entries leave room to spare and stop a decompression bomb.
        max_unpacked=2_000_000_000, max_files=50_000),
}
"""The archives fetched when a spec names no path, by data set (``cub-cropped`` reads ``cub``'s)."""

MANUAL: dict[str, str] = {
    "cars": ("Cars-196 is not downloaded automatically: its official host no longer serves it reliably. Download "
             "car_ims.tgz and cars_annos.mat from Stanford's page https://ai.stanford.edu/~jkrause/cars/"
             "car_dataset.html, unpack car_ims.tgz beside cars_annos.mat, so that the folder holds cars_annos.mat "
             "and car_ims/000001.jpg ..., and give that folder: --data cars:PATH"),
    "sop": ("Stanford Online Products is not downloaded automatically: its official host no longer serves it "
            "reliably. Download Stanford_Online_Products.zip from Stanford's page "
            "https://cvgl.stanford.edu/projects/lifted_struct/, unpack it, and give the folder "
            "Stanford_Online_Products (or its parent), which holds Ebay_train.txt, Ebay_test.txt and the "
            "bicycle_final/ ... toaster_final/ image folders: --data sop:PATH"),
    "inshop": ("In-Shop (DeepFashion In-shop Clothes Retrieval) is not downloaded automatically: its official host "
               "no longer serves it reliably. Download Eval/list_eval_partition.txt and Img/img.zip from its page "
               "https://mmlab.ie.cuhk.edu.hk/projects/DeepFashion/InShopRetrieval.html, unpack img.zip in Img/, so "
               "that the folder holds Eval/list_eval_partition.txt and Img/img/..., and give that folder: "
               "--data inshop:PATH"),
}
"""Where the benchmarks that are not fetched are officially published, and the layout their ``PATH`` needs."""


def manual_download(name: str) -> str | None:
    """How to get data set ``name`` (``cars-cropped``: as ``cars``) when it is not fetched; None if unknown."""
    return MANUAL.get(name.removesuffix("-cropped"))


# ---------------------------------------------------------------------------------------------- downloading

def _write_block(handle: IO[bytes], block: bytes) -> None:
    handle.write(block)


def _no_space(name: str, folder: Path, needed: int, what: str) -> DataError:
    return DataError(f"{name}: no space left in {folder}: {what} needs {needed:,} bytes more; free some space (or "
                     "point DEEPMETRIC_DATA at a larger disk) and run again")


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


class _Cut(Exception):
    """One attempt stopped early (a cut connection, a timeout, a server error): it can be resumed."""


def _attempt(name: str, archive: Archive, part: Path, progress: bool) -> None:
    """Download (the rest of) ``archive`` into ``part``; raises ``_Cut`` when the transfer stops early."""
    from ..progress import progress_bar

    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(archive.url, headers={"User-Agent": "deepmetric"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        response = urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as error:
        if error.code == 416 and have:  # the .part is as long as the file, or longer: the checksum decides
            if have >= archive.size:
                return
            part.unlink()
            raise _Cut(f"{archive.url} refused to resume at byte {have:,}") from None
        if error.code >= 500 or error.code == 429:
            raise _Cut(f"{archive.url} answered HTTP {error.code} {error.reason}") from None
        raise DataError(f"{name}: {archive.url} answered HTTP {error.code} {error.reason}; download "
                        f"{archive.filename} from {archive.page} yourself, unpack it and use --data {name}:PATH") \
            from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
        reason = getattr(error, "reason", None) or error
        raise _Cut(f"cannot reach {archive.url}: {reason}") from None
    with response:
        status = response.status
        content_range = response.headers.get("Content-Range", "")
        if status == 206 and content_range.startswith(f"bytes {have}-"):
            mode = "ab"
        else:  # the server sent the whole file: start again
            mode, have = "wb", 0
        length = response.headers.get("Content-Length")
        total = have + int(length) if length and length.isdigit() else archive.size
        if total > archive.size:  # before the free space: 10**15 bytes were reported as "no space left"
            raise DataError(f"{name}: {archive.url} announces {total:,} bytes, more than the published "
                            f"{archive.size:,} of {archive.filename}: it is not the published archive, and nothing of "
                            f"it was written; download it from {archive.page} yourself, unpack it and use --data "
                            f"{name}:PATH")
        free = shutil.disk_usage(part.parent).free
        if free < total - have:
            raise _no_space(name, part.parent, total - have, f"the download of {archive.filename}")
        written = have
        bar = progress_bar(None, total=total, initial=have, desc=f"downloading {name}", unit="B", unit_scale=True,
                           unit_divisor=1024, disable=not progress)
        try:
            with open(part, mode) as handle:
                while True:
                    try:
                        block = response.read(CHUNK)
                    except (OSError, http.client.HTTPException) as error:
                        raise _Cut(f"the connection to {archive.url} was cut after {written:,} of {total:,} "
                                   f"bytes ({type(error).__name__}: {error})") from None
                    if not block:
                        break
                    if written + len(block) > archive.size:  # a body without a length, streamed on and on
                        handle.close()
                        part.unlink(missing_ok=True)
                        raise DataError(f"{name}: {archive.url} sent more than the published {archive.size:,} bytes "
                                        f"of {archive.filename}: it is not the published archive; what it sent was "
                                        "deleted. Run again to download it anew, or download it from "
                                        f"{archive.page} yourself, unpack it and use --data {name}:PATH")
                    try:
                        _write_block(handle, block)
                    except OSError as error:
                        if error.errno == errno.ENOSPC:
                            raise _no_space(name, part.parent, total - written,
                                            f"the download of {archive.filename}") from None
                        raise DataError(f"{name}: cannot write {part}: {error.strerror or error}") from None
                    written += len(block)
                    bar.update(len(block))
        finally:
            bar.close()
    if written < total:
        raise _Cut(f"the connection to {archive.url} was cut after {written:,} of {total:,} bytes")


def download(name: str, archive: Archive, target: Path, progress: bool = True) -> None:
    """Download ``archive`` to ``target`` and check its MD5, resuming ``target.part``; a file whose MD5 differs is
    deleted and refused."""
    part = target.with_name(target.name + ".part")
    part.parent.mkdir(parents=True, exist_ok=True)
    problem = ""
    for attempt in range(1, ATTEMPTS + 1):
        if attempt > 1:
            log.warning("%s: %s; resuming (attempt %d of %d)", name, problem, attempt, ATTEMPTS)
            time.sleep(RETRY_WAIT_S)
        try:
            _attempt(name, archive, part, progress)
        except _Cut as cut:
            problem = str(cut)
            continue
        break
    else:
        kept = f"; the {part.stat().st_size:,} bytes received are kept in {part}" if part.exists() else ""
        raise DataError(f"{name}: {problem}{kept} and the download resumes when run again; or download "
                        f"{archive.filename} from {archive.page} yourself, unpack it and use --data {name}:PATH")
    found = _md5(part)
    if found != archive.md5:
        size = part.stat().st_size
        part.unlink()
        raise DataError(f"{name}: {archive.url} sent a file whose MD5 is {found} ({size:,} bytes), not the "
                        f"published {archive.md5}; it was deleted. Run again to download it anew")
    os.replace(part, target)


# ---------------------------------------------------------------------------------------------- unpacking

def _extract(tar: tarfile.TarFile, member: tarfile.TarInfo, folder: Path) -> None:
    tar.extract(member, folder, filter="data")


def _unpacked_size(path: Path) -> int:
    try:
        with tarfile.open(path) as tar:
            return sum(m.size for m in tar)
    except (tarfile.TarError, OSError, EOFError):
        return 0


def unpack(name: str, archive: Archive, source: Path, tmp: Path, progress: bool = True) -> None:
    """Unpack ``source`` into ``tmp`` and check that ``tmp/<folder>`` holds ``archive.expected``."""
    from ..progress import progress_bar

    unpacked = files = 0
    try:
        with tarfile.open(source) as tar:
            for member in progress_bar(tar, desc=f"unpacking {name}", unit="file", disable=not progress):
                unpacked, files = unpacked + max(member.size, 0), files + 1
                if unpacked > archive.max_unpacked or files > archive.max_files:  # before the member is written
                    raise DataError(f"{name}: {source} unpacks to more than {archive.max_unpacked:,} bytes or "
                                    f"{archive.max_files:,} entries (reached {unpacked:,} bytes in {files:,} at "
                                    f"{member.name!r}), far more than the published {archive.filename} holds; "
                                    "unpacking stopped and what was unpacked is removed")
                _extract(tar, member, tmp)
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise _no_space(name, tmp.parent, _unpacked_size(source), f"unpacking {archive.filename}") from None
        raise DataError(f"{name}: cannot unpack {source}: {error.strerror or error}") from None
    except (tarfile.TarError, EOFError) as error:
        raise DataError(f"{name}: {source} cannot be read as a tarball: {error}") from None
    missing = _missing(tmp / archive.folder, archive)
    if missing:
        raise DataError(f"{name}: {archive.filename} from {archive.url} does not hold {archive.folder}/"
                        f"{{{', '.join(archive.expected)}}}: {', '.join(missing)} missing")


def is_built(root: Path, archive: Archive) -> bool:
    """Whether ``root`` is a complete build of ``archive``: its ``meta.json`` names the archive's MD5 and the
    expected layout is there."""
    try:
        meta = json.loads((root / "meta.json").read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    return (isinstance(meta, dict) and meta.get("format") == FORMAT_VERSION and meta.get("md5") == archive.md5
            and not _missing(root / archive.folder, archive))


def _missing(folder: Path, archive: Archive) -> list[str]:
    """The entries of ``archive.expected`` that ``folder`` lacks."""
    return [e for e in archive.expected if not ((folder / e).is_dir() if e.endswith("/") else (folder / e).is_file())]


def _has_marker(root: Path) -> bool:
    """Whether ``root/meta.json`` is this project's marker (of any archive): the folder was built by ``_fetch``."""
    try:
        meta = json.loads((root / "meta.json").read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(meta, dict) and isinstance(meta.get("format"), int) and {"url", "md5", "folder"} <= meta.keys()


def _check_ours(name: str, archive: Archive, root: Path, archive_file: bool = True) -> None:
    """Refuse to go on when ``root`` (and, with ``archive_file``, the archive's file beside it) is there and was not
    made by this project: fetching would replace it. Raises ``DataError`` naming the thing and the ways out."""
    if root.is_symlink():
        try:
            link = os.readlink(root)
        except OSError:
            link = "?"
        raise DataError(f"{name}: {root} is a symbolic link (to {link}) that does not lead to a complete "
                        f"{archive.folder} build; deepmetric never replaces what it did not create. Give the data "
                        f"itself with --data {name}:PATH, or remove the link and run again to download it")
    if root.exists() and not _has_marker(root):
        raise DataError(f"{name}: {root} exists but was not built by deepmetric (it holds no meta.json of ours); "
                        "deepmetric never deletes what it did not create. If it holds the data set, use it with "
                        f"--data {name}:{root}; otherwise move it away (or set DEEPMETRIC_DATA to another folder) and "
                        "run again to download it")
    if not archive_file:
        return
    target = root.parent / archive.filename
    if target.is_symlink() or (target.exists() and (not target.is_file() or _md5(target) != archive.md5)):
        raise DataError(f"{name}: {target} exists but is not the published {archive.filename} (MD5 "
                        f"{archive.md5}); deepmetric did not download it and leaves it alone: move it away (or set "
                        f"DEEPMETRIC_DATA to another folder) and run again, or unpack it and use --data {name}:PATH")


def fetch(name: str, root: Path | None = None, progress: bool = True) -> Path:
    """The folder of data set ``name``'s unpacked archive (``ARCHIVES``), ``root`` (default ``data_home()/name``):
    used as it is when built, else downloaded, checked, unpacked and renamed there complete."""
    archive = ARCHIVES.get(name)
    if archive is None:
        raise DataError(manual_download(name) or f"{name}: no archive to download; use --data {name}:PATH")
    root = Path(root) if root is not None else data_home() / name
    if is_built(root, archive):
        return root
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise unwritable(name, root.parent, error) from None
    with taking_turns(root.parent / f".{root.name}.lock", name):
        if is_built(root, archive):  # built by the process this one waited for
            return root
        _check_ours(name, archive, root)
        return _fetch(name, archive, root, progress)


def _fetch(name: str, archive: Archive, root: Path, progress: bool) -> Path:
    """``fetch``'s work, under its lock: download (or resume), check, unpack, mark and rename into ``root``."""
    target = root.parent / archive.filename  # when there, the checked archive of an earlier run (``_check_ours``)
    if not target.exists():
        log.info("%s: downloading %s (%s bytes) to %s", name, archive.url, f"{archive.size:,}", root.parent)
        download(name, archive, target, progress)
    tmp = temporary_folder(root)
    try:
        unpack(name, archive, target, tmp, progress)
        meta = {"format": FORMAT_VERSION, "url": archive.url, "md5": archive.md5, "folder": archive.folder}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        _check_ours(name, archive, root, archive_file=False)  # again: it may have been made during the download
        if root.exists():  # a build of ours (the marker), of another archive or damaged
            shutil.rmtree(root)
        os.replace(tmp, root)
        fsync_dir(root.parent)
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise _no_space(name, root.parent, _unpacked_size(target), f"unpacking {archive.filename}") from None
        raise DataError(f"{name}: cannot write {root}: {error.strerror or error}") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    target.unlink()
    log.info("%s: %s unpacked to %s", name, archive.filename, root)
    return root
