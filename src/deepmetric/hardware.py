"""What the machine is: fields of /proc/cpuinfo (the kNN picks its BLAS by the CPU's vendor, family and model;
benchmarks record the CPU's model)."""

from __future__ import annotations

import functools
from pathlib import Path


@functools.cache
def cpu_info(field: str) -> str:
    """The first value of ``field`` in /proc/cpuinfo (``vendor_id``: GenuineIntel, AuthenticAMD...;
    ``model name``); '' where there is no such file or field (other systems, ARM CPUs)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == field:
                return value.strip()
    except OSError:
        pass
    return ""
