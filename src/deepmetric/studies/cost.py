"""What a study's runs cost to train, read from each finished run's own files (so a fresh checkout's restored
record gives the same table): the rate its log records (``images_per_s``, the mean over each logging window),
the training time that rate implies, and the machine ``environment.json`` names.

A run's training time is the sum over its logged windows of (steps in the window x batch size) / the window's
rate: the time spent in training steps, validation and the test evaluation excluded; a resumed run counts each
step once (the log of the steps redone after a resume is cut back, ``RunDir.truncate_log``). The rate is the
machine's as the run found it: runs that shared a machine (several study processes on one GPU, or a test suite
beside a CPU run) report the share they got.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from ..errors import DeepMetricError
from ..runs.folder import RunDir
from .record import finished
from .spec import StudyRun, StudySpec
from .text import cell


def machine_of(folder: RunDir) -> str:
    """The machine(s) of a run's training sessions: the GPU's name, else the CPU's (with its generation where the
    run recorded one, since two generations can share a name) and its threads; ``?`` when ``environment.json`` does
    not say."""
    try:
        sessions = json.loads(folder.environment.read_text()).get("sessions", [])
    except (OSError, ValueError, AttributeError, RecursionError):
        return "?"
    names = []
    for session in sessions if isinstance(sessions, list) else []:
        if not isinstance(session, dict):
            continue
        threads = session.get("threads")
        generation = f" ({session['cpu_generation']})" if session.get("cpu_generation") else ""
        name = session.get("gpu") or (f"{session.get('cpu', '?')}{generation}, {threads} "
                                      f"thread{'' if threads == 1 else 's'}")
        names.append(str(name))
    return " + ".join(dict.fromkeys(names)) or "?"


def batch_of(folder: RunDir) -> int | None:
    """Images per training step, from the run's saved config (P classes x K samples)."""
    try:
        data = (yaml.safe_load(folder.config_path.read_text()) or {}).get("data", {})
        return int(data["classes_per_batch"]) * int(data["samples_per_class"])
    except (OSError, yaml.YAMLError, AttributeError, KeyError, TypeError, ValueError, RecursionError):
        return None


def run_cost(folder: RunDir) -> dict[str, Any] | None:
    """``{"images_per_s": median logged rate, "seconds": training time, "machine": ...}`` of a finished run, or
    None when its log records no rate."""
    batch = batch_of(folder)
    try:
        log = [r for r in folder.read_log() if isinstance(r.get("images_per_s"), int | float)
               and isinstance(r.get("step"), int) and r["images_per_s"] > 0]
    except (DeepMetricError, OSError):
        return None
    if batch is None or not log:
        return None
    seconds, previous = 0.0, 0
    for record in sorted(log, key=lambda r: r["step"]):
        seconds += max(record["step"] - previous, 0) * batch / record["images_per_s"]
        previous = record["step"]
    return {"images_per_s": statistics.median(r["images_per_s"] for r in log), "seconds": seconds,
            "machine": machine_of(folder)}


def training_cost(spec: StudySpec, folder_of: Callable[[StudyRun], Path] | None = None) -> str:
    """The "Training cost" section of a study's ``results.md``: per variant and machine, the finished runs' median
    rate and training time per run (a variant whose runs trained on a CPU and a GPU gets a row for each: a median
    across machines would describe neither). Empty when no run logged a rate."""
    costs: dict[str, dict[str, list[dict[str, Any]]]] = {}  # variant -> machine -> runs, each in the order first met
    for run in spec.runs():
        folder = RunDir((folder_of or spec.run_dir)(run))
        cost = run_cost(folder) if finished(folder) else None
        if cost is not None:
            costs.setdefault(run.variant, {}).setdefault(cost["machine"], []).append(cost)
    if not costs:
        return ""
    lines = ["## Training cost", "",
             "Read from each run's log: the median logged rate, and the time its training steps took (validation "
             "and test evaluation excluded), median over the variant's runs on that machine; a rate is the "
             "machine's share the run got (runs sharing a machine report less).", "",
             "| variant | runs | images/s | training time per run | machine |", "|---|---|---|---|---|"]
    for variant, machines in costs.items():
        for machine, group in machines.items():
            rate = statistics.median(c["images_per_s"] for c in group)
            seconds = statistics.median(c["seconds"] for c in group)
            lines.append(f"| {cell(variant)} | {len(group)} | {rate:.0f} | {duration(seconds)} | {cell(machine)} |")
    return "\n".join(lines) + "\n"


def duration(seconds: float) -> str:
    """``42 s``, ``12.5 min``, ``2.3 h``."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 3600 else f"{seconds / 3600:.1f} h"
