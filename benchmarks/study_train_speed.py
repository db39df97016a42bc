"""Training speed of every variant of a study, as a ratio to its first variant, measured in one process.

Study runs are trained one after another (often by several processes at once, on a machine doing other work), so
their wall times do not compare. This script trains each variant of a study file for a few steps with the real
trainer (data loading, the objective, MIRAGE's extra steps, all of it) in rounds -- variant 1, 2, ..., then again
-- after one untimed warm-up run, so every variant meets the same machine, and reports the median images/s of the
logged windows after the first (which holds each run's own warm-up) and its ratio to the first variant. The runs
go to a temporary folder; validation and the test evaluation are off.

    DEEPMETRIC_DATA=/tmp/dmdata .venv/bin/python benchmarks/study_train_speed.py configs/studies/emoji.yaml \
        [--steps 24] [--log-every 6] [--rounds 2] [--only gap,abe] [key=value ...]

Prints a table and writes benchmarks/results/study_train_speed-<study>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from _results import environment, write_result

from deepmetric.config import build_config, parse_override
from deepmetric.studies import load_study
from deepmetric.training import train


def windows(run: Path) -> list[float]:
    """images/s of each logged training window after the first."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rates = [r["images_per_s"] for r in records if "images_per_s" in r]
    return rates[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--log-every", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", help="comma-separated variants (default: every variant of the first repeat)")
    parser.add_argument("--out")
    args = parser.parse_intermixed_args()

    timing = {"train": {"steps": args.steps, "log_every": args.log_every, "eval_every": 10**9,
                        "checkpoint_every": 10**9}, "eval": {"baseline": False}, "data": {"val_fraction": 0.0}}
    spec = load_study(args.study, [parse_override(text) for text in args.overrides] + [timing])
    only = args.only.split(",") if args.only else list(spec.variants)
    runs = [run for run in spec.runs() if run.repeat == spec.repeats[0] and run.variant in only]
    rates: dict[str, list[float]] = {run.variant: [] for run in runs}
    with tempfile.TemporaryDirectory() as scratch:
        # an untimed run first: the process's first training (thread pools, allocator, the image table's cache) is
        # slower than any later one, and would otherwise be charged to the first variant, the reference
        train(build_config(*runs[0].layers), Path(scratch) / "warm-up", progress=False)
        for round_ in range(args.rounds):
            for run in runs:
                folder = Path(scratch) / f"{run.variant}-{round_}"
                train(build_config(*run.layers), folder, progress=False)
                measured = windows(folder)
                rates[run.variant] += measured
                print(f"round {round_ + 1}/{args.rounds} {run.variant}: {statistics.median(measured):.1f} images/s",
                      flush=True)

    medians = {name: statistics.median(r) for name, r in rates.items()}
    reference = medians[runs[0].variant]
    rows = [{"variant": name, "images_per_s": medians[name], "windows": len(rates[name]),
             "time_ratio": reference / medians[name]} for name in rates]
    print(f"\n| variant | images/s | time per image, × {runs[0].variant} |\n|---|---|---|")
    for row in rows:
        print(f"| {row['variant']} | {row['images_per_s']:.1f} | {row['time_ratio']:.2f} |")
    out = args.out or Path(__file__).parent / "results" / f"study_train_speed-{spec.name}.json"
    write_result(out, {"study": spec.name, "steps": args.steps, "log_every": args.log_every, "rounds": args.rounds,
                       "overrides": args.overrides, "rows": rows, "environment": environment()})
    print(f"written: {out}")


if __name__ == "__main__":
    main()
