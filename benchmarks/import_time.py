"""How long `search` and `serve` take to start: a fresh process importing what they import, against a reference.

Each measurement is a fresh ``python -X importtime -c "import MODULE"`` (the interpreter's own per-module timer,
summed over every module the import loads), so nothing is cached in the process; the disk cache is warm after the
first round. The reference is the same measurement of ``import torch, torchvision`` (the floor every command that
loads a model pays), so each figure is also a ratio to it, from the same rounds.

Give several source trees (``--src``) to compare them in one run, rounds interleaved: for example the tree before
a change (``git worktree add /tmp/before <commit>``) and the working tree.

    .venv/bin/python benchmarks/import_time.py --src /tmp/before/src --src src [--rounds 7]

Prints a table and writes benchmarks/results/import_time.json (milliseconds, ratios to the reference, the number of
modules each import loads, which does not depend on the machine's load, and the deepmetric packages among them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from _results import environment, write_result

MODULES = ("deepmetric.retrieval.search", "deepmetric.retrieval.service", "deepmetric.api")
REFERENCE = "torch, torchvision"


def import_ms(module: str, src: str) -> tuple[float, list[str]]:
    """Milliseconds a fresh interpreter spends importing ``module`` (``-X importtime``'s cumulative time of the
    top-level imports) with ``src`` first on the path, and the deepmetric packages it loaded."""
    code = (f"import {module}, sys\n"
            "print(len(sys.modules), "
            "' '.join(sorted({n.split('.')[1] for n in sys.modules if n.startswith('deepmetric.')})))")
    env = {**os.environ, "PYTHONPATH": src}
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                          env=env, check=True)
    total_us = 0
    for line in done.stderr.splitlines():  # "import time: self [us] | cumulative | imported package"
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.removeprefix("import time:").split("|")
        if not name.startswith("  "):  # a top-level import (nested ones are indented and inside it)
            total_us += int(cumulative)
    return total_us / 1000, done.stdout.split()  # [modules loaded, deepmetric packages...]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", action="append", help="a source tree (the folder holding deepmetric/); repeatable")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default="benchmarks/results/import_time.json")
    args = parser.parse_args()
    trees = [str(Path(s).resolve()) for s in (args.src or ["src"])]
    times: dict[tuple[str, str], list[float]] = {}
    loaded: dict[tuple[str, str], list[str]] = {}
    for _ in range(args.rounds):  # interleaved: a busy moment of the machine falls on every tree alike
        for tree in trees:
            for module in (REFERENCE, *MODULES):
                ms, packages = import_ms(module, tree)
                times.setdefault((tree, module), []).append(ms)
                loaded[(tree, module)] = packages
    rows = []
    for tree in trees:
        reference = statistics.median(times[(tree, REFERENCE)])
        for module in MODULES:
            median = statistics.median(times[(tree, module)])
            rows.append({"src": tree, "module": module, "median_ms": round(median, 1),
                         "reference_ms": round(reference, 1), "ratio_to_reference": round(median / reference, 3),
                         "modules_loaded": int(loaded[(tree, module)][0]),
                         "trainer_loaded": "training" in loaded[(tree, module)][1:],
                         "deepmetric_packages": loaded[(tree, module)][1:]})
    print(f"{'source tree':40s} {'module':32s} {'ms':>8s} {'÷ torch+tv':>10s} {'modules':>8s}  trainer")
    for row in rows:
        print(f"{row['src'][-40:]:40s} {row['module']:32s} {row['median_ms']:8.1f} {row['ratio_to_reference']:10.3f}"
              f" {row['modules_loaded']:8d}  {'loaded' if row['trainer_loaded'] else '-'}")
    write_result(args.out, {"benchmark": "import_time", "reference": f"import {REFERENCE}", "rounds": args.rounds,
                            "rows": rows, "environment": environment()})
    print(json.dumps({"written": args.out}))


if __name__ == "__main__":
    main()
