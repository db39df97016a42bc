"""Where a result came from: the software and the machine that trained or evaluated a run.

``RUN/environment.json`` gets one record per training session (a resumed run has several, possibly from
different machines), and every test evaluation file (``metrics.json``, ``baseline.json``,
``metrics-all-embeddings.json``) carries the record of the machine that computed it, with the kNN engine
it used: the last bit of a float32 similarity depends on the product kernel (``evaluation/knn.py``).
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from .hardware import cpu_info

PACKAGES = ("deepmetric", "torchvision", "timm", "numpy")
FAISS_DISTRIBUTIONS = ("faiss-cpu", "faiss-gpu", "faiss-gpu-cu12", "faiss")


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def software() -> dict[str, str | None]:
    """Installed versions of Python, deepmetric and what its numbers depend on (None: not installed); torch's
    with its build (``+cu130``, ``+cpu``) and the CUDA it was built for."""
    versions: dict[str, str | None] = {"python": platform.python_version(), "torch": torch.__version__,
                                       "torch_cuda": torch.version.cuda}
    versions.update({name: _version(name) for name in PACKAGES})
    versions["faiss"] = next(filter(None, map(_version, FAISS_DISTRIBUTIONS)), None)
    return versions


def source_revision(folder: str | Path | None = None) -> str | None:
    """The git commit of ``folder`` (deepmetric's own source by default), with ``-dirty`` when tracked files
    under ``folder`` have uncommitted changes (a change elsewhere in the checkout, such as the study record a
    running study writes under ``docs/``, does not change what trains); None where git is missing or the folder's
    files are not tracked by a repository (an installed wheel, also one in a virtual environment inside some other
    project's checkout)."""
    folder = Path(folder) if folder is not None else Path(__file__).resolve().parent
    try:
        def git(*args: str) -> str:
            return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=10,
                                  check=True).stdout.strip()

        if not git("ls-files", "--", "."):  # no tracked file here: not the repository's own source
            return None
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--", "."))
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("-dirty" if dirty else "")


def cpu_generation() -> str | None:
    """The x86 processor's family, model and stepping (``family 26 model 2 stepping 1``), or None where
    /proc/cpuinfo does not give them. A virtual machine's model name can be as bare as ``AMD EPYC`` for processors
    of different generations, six times apart in speed (seen in one study's runs); these numbers tell them apart."""
    fields = [cpu_info(field) for field in ("cpu family", "model", "stepping")]
    return None if not all(fields) else "family {} model {} stepping {}".format(*fields)


def machine(device: str | torch.device = "cpu") -> dict[str, Any]:
    """The processor (its name and, on x86, its generation), torch's threads, and the device (with the GPU's name
    on CUDA)."""
    device = torch.device(device)
    record: dict[str, Any] = {"machine": platform.machine(), "cpu": cpu_info("model name") or platform.processor(),
                              "cpu_generation": cpu_generation(), "cpu_count": os.cpu_count(),
                              "threads": torch.get_num_threads(), "device": str(device)}
    if device.type == "cuda":
        record["gpu"] = torch.cuda.get_device_name(device)
    return record


def evaluation_environment(device: str | torch.device, engine: str) -> dict[str, Any]:
    """``environment`` of a test evaluation: with the kNN engine that ``engine`` (e.g. ``auto``) resolves to."""
    from .evaluation.knn import resolve_engine

    return environment(device, knn_engine=resolve_engine(engine))


def environment(device: str | torch.device = "cpu", **extra: Any) -> dict[str, Any]:
    """One record: the time, the software (and deepmetric's commit), the machine and ``extra``."""
    return {"at": time.strftime("%Y-%m-%d %H:%M:%S"), **software(),
            "source": source_revision(), **machine(device), **extra}
