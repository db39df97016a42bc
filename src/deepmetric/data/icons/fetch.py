"""Fetching the icon themes' ``.deb`` files (``apt-get download NAME=VERSION``), or finding them in a folder
(``icons:PATH``), each checked against the SHA-256 the Debian archive publishes (pinned in
``catalogue.PACKAGES``)."""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ...errors import DataError
from ...io.files import file_sha256
from .catalogue import Package

SOURCE_HOLDS = "the icon themes' .deb files"
"""What ``icons:PATH`` is the folder of."""

log = logging.getLogger("deepmetric")

Fetcher = Callable[[Sequence[Package], Path], None]
"""Fetches packages' ``.deb`` files into a folder, named ``Package.deb`` (``apt_get_download``; tests give another)."""


# ---------------------------------------------------------------------------------------------- fetching


def check_deb(path: Path, package: Package) -> None:
    """Refuse a ``.deb`` whose SHA-256 differs from the one pinned for ``package``."""
    found = file_sha256(path)
    if found != package.sha256:
        raise DataError(f"icons: {path} is not {package.name} {package.version} as the Debian archive publishes it "
                        f"(its SHA-256 is {found[:16]}..., the pinned one {package.sha256[:16]}...); delete it and "
                        "fetch it again")


def _apt_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("E:")]
    return (errors or lines or ["no message"])[0][:300]


def apt_get_download(packages: Sequence[Package], folder: Path) -> None:
    """Fetch ``packages``' ``.deb`` files into ``folder`` with Debian's own client (``apt-get download``)."""
    apt = shutil.which("apt-get")
    if apt is None:
        raise DataError("icons: fetching the icon themes needs Debian's package client apt-get, which is not here. "
                        "On another machine, fetch them with: apt-get download "
                        + " ".join(p.spec for p in packages) + "; then put the .deb files in a folder and use "
                        "--data icons:FOLDER")
    # apt-get's output (progress, notices) is captured, never left on this process's standard output
    result = subprocess.run([apt, "download", *(p.spec for p in packages)], cwd=folder, stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, errors="replace")
    if result.returncode != 0:
        raise DataError(f"icons: apt-get download failed (exit {result.returncode}): {_apt_error(result.stderr)}. "
                        "The package lists may be stale (apt-get update, as root) or the registry unreachable; "
                        "without it, put the .deb files in a folder and use --data icons:FOLDER")


def fetch_debs(packages: Mapping[str, Package], folder: Path, fetch: Fetcher) -> dict[str, Path]:
    """Fetch every package into ``folder`` with ``fetch`` and check each file; returns them by package name."""
    log.info("icons: fetching %d Debian icon-theme packages with apt-get", len(packages))
    fetch(list(packages.values()), folder)
    found = {}
    for package in packages.values():
        path = folder / package.deb
        if not path.is_file():
            raise DataError(f"icons: apt-get download {package.spec} did not write {package.deb}")
        check_deb(path, package)
        found[package.name] = path
    return found


def find_deb(folder: Path, package: Package) -> Path:
    """``package``'s ``.deb`` in ``folder`` (as ``apt-get download`` names it, or with the epoch's colon), checked."""
    for name in (package.deb, package.deb.replace("%3a", ":")):
        if (folder / name).is_file():
            check_deb(folder / name, package)
            return folder / name
    others = sorted(p.name for p in folder.glob(f"{package.name}_*.deb"))
    hint = f" ({', '.join(others)} is another version)" if others else ""
    raise DataError(f"icons: {folder} has no {package.deb}{hint}; fetch it with: apt-get download {package.spec}")
