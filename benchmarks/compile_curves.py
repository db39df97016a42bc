"""``train.compile`` head by head: the loss curve of a compiled run against the eager run of the same seed, and its
speed, with the real trainer, in one process.

For each variant of a study (``--only``), three runs of ``--steps`` steps each are trained one after the other with
the study's settings and the same seed: eager (``train.compile=false``), compiled (``train.compile=true``) and the
rounding yardstick, eager again in the other memory layout (``train.channels_last`` flipped: the same arithmetic
summed in another order, which the project tests equal to float rounding); the loss is logged at every step. Reported
per variant:

- the loss curves' largest relative difference over the steps, ``|compiled - eager| / |eager|``, and the first step
  where it exceeds ``--tolerance`` (a compiled kernel sums in another order, so the curves part by rounding and,
  through the optimiser, drift; an error in the compiled graph parts them at once and by much); the same for the
  yardstick's curve, which says how far rounding alone takes two curves apart over as many steps (training
  amplifies a last-bit difference: a fixed tolerance cannot tell rounding from a fault at step 200);
- the median images/s of each run's steps after ``--warmup`` (the compiled run's first steps hold its compilation)
  and their ratio, compiled over eager;
- the compiled run's first ``--warmup`` steps' extra seconds over the eager run's (about the compilation);
- whether the compiled run fell back to eager (its warning).

The issue's rule for turning ``train.compile`` on by default for a head on CUDA: at least 1.2 times as fast, and the
curve within float tolerance over 200 steps: read here as the compiled curve parting from the eager one no earlier and
no further than the yardstick's, within a factor of 2 (``within_rounding``). ``--no-yardstick`` leaves that run
out.

    python3 benchmarks/compile_curves.py configs/studies/emoji-160px.yaml [--only gap,abe] [--steps 200] \
        [--warmup 20] [--tolerance 0.01] [--out FILE] [key=value ...]

Prints a table and writes benchmarks/results/compile_curves-<study>.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
from pathlib import Path
from typing import Any

from _results import environment, write_result

from deepmetric.config import build_config
from deepmetric.config.layers import parse_settings
from deepmetric.devices import resolve_device
from deepmetric.studies import load_study
from deepmetric.training import train


class Warnings(logging.Handler):
    """The warnings deepmetric logs while a run trains."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def logged_steps(run: Path) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "loss" in r and "split" not in r]


def compare(eager: list[dict[str, Any]], compiled: list[dict[str, Any]], warmup: int,
            tolerance: float) -> dict[str, Any]:
    """The two runs' curves and speeds, as the module's docstring lists them."""
    differences = [abs(c["loss"] - e["loss"]) / max(abs(e["loss"]), 1e-12)
                   for e, c in zip(eager, compiled, strict=True)]
    parted = next((e["step"] for e, d in zip(eager, differences, strict=True) if d > tolerance), None)
    rates = {name: statistics.median(r["images_per_s"] for r in steps[warmup:])
             for name, steps in (("eager", eager), ("compiled", compiled))}
    first = {name: sum(1 / r["images_per_s"] for r in steps[:warmup])
             for name, steps in (("eager", eager), ("compiled", compiled))}  # seconds per image, summed: relative
    return {"steps": len(differences), "largest_relative_difference": max(differences),
            "relative_difference_at_last_step": differences[-1], "first_step_over_tolerance": parted,
            "images_per_s": rates, "speed_ratio": rates["compiled"] / rates["eager"],
            "warmup_seconds_per_image": first}


def within_rounding(row: dict[str, Any], yardstick: dict[str, Any], factor: float = 2.0) -> bool:
    """Whether the compiled curve parts from the eager one as rounding alone parts two curves: its largest relative
    difference at most ``factor`` times the yardstick's, and its first step over the tolerance (None: none) no earlier
    than the yardstick's divided by ``factor``. Rounding's drift is chaotic (two perturbations of the last bit part at
    different steps), hence a factor rather than an order; a fault in the compiled graph parts the curves from the
    first steps and by far more."""
    first, first_rounding = row["first_step_over_tolerance"], yardstick["first_step_over_tolerance"]
    early = first is not None and (first_rounding is None or first < first_rounding / factor)
    return row["largest_relative_difference"] <= factor * yardstick["largest_relative_difference"] and not early


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    parser.add_argument("--only", help="comma-separated variants (default: every variant of the first repeat)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20, help="steps left out of the speed (default 20)")
    parser.add_argument("--tolerance", type=float, default=0.01, help="relative loss difference (default 0.01)")
    parser.add_argument("--no-yardstick", action="store_true",
                        help="leave out the eager run in the other memory layout (the rounding yardstick)")
    parser.add_argument("--out")
    args = parser.parse_intermixed_args()

    timing = {"train": {"steps": args.steps, "log_every": 1, "eval_every": 10**9, "checkpoint_every": 10**9},
              "eval": {"baseline": False}, "data": {"val_fraction": 0.0}}
    spec = load_study(args.study, [timing], settings=parse_settings(args.overrides))
    runs = [run for run in spec.runs(args.only.split(",") if args.only else ()) if run.repeat == spec.repeats[0]]
    warnings = Warnings()
    logging.getLogger("deepmetric").addHandler(warnings)
    rows: dict[str, Any] = {}
    device = resolve_device("cpu")
    with tempfile.TemporaryDirectory() as scratch:
        for run in runs:
            steps, fell_back = {}, False
            modes = ("eager", "compiled") + (() if args.no_yardstick else ("yardstick",))
            for mode in modes:
                layers = [*run.layers, {"train": {"compile": mode == "compiled"}}]
                if mode == "yardstick":
                    channels_last = build_config(*layers).train.channels_last
                    layers.append({"train": {"channels_last": not channels_last}})
                config = build_config(*layers)
                device = resolve_device(config.train.device)
                folder = Path(scratch) / f"{run.variant}-{mode}"
                warnings.messages.clear()
                train(config, folder, progress=False)
                steps[mode] = logged_steps(folder)
                if mode == "compiled":
                    fell_back = any("cannot be compiled" in message for message in warnings.messages)
            row = {**compare(steps["eager"], steps["compiled"], args.warmup, args.tolerance),
                   "fell_back_to_eager": fell_back,
                   "losses": {mode: [r["loss"] for r in logged] for mode, logged in steps.items()}}
            if "yardstick" in steps:
                yardstick = compare(steps["eager"], steps["yardstick"], args.warmup, args.tolerance)
                row["yardstick"] = {key: yardstick[key] for key in (
                    "largest_relative_difference", "relative_difference_at_last_step", "first_step_over_tolerance")}
                row["within_rounding"] = within_rounding(row, row["yardstick"])
            rows[run.variant] = row
            print(f"{run.variant}: compiled {row['speed_ratio']:.2f}x eager "
                  f"({row['images_per_s']['compiled']:.0f} vs {row['images_per_s']['eager']:.0f} images/s), "
                  f"largest loss difference {row['largest_relative_difference']:.2e}"
                  + (f" (rounding alone: {row['yardstick']['largest_relative_difference']:.2e})"
                     if "yardstick" in row else "")
                  + (" (fell back to eager)" if fell_back else ""), flush=True)
    print(f"\n| variant | eager images/s | compiled images/s | compiled ÷ eager | largest relative loss difference "
          f"| first step over {args.tolerance:g} | the same, eager in the other layout | within rounding |"
          f"\n|---|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        yard = row.get("yardstick")
        rounding = "—" if yard is None else \
            f"{yard['largest_relative_difference']:.2e}, {yard['first_step_over_tolerance'] or '—'}"
        print(f"| {name} | {row['images_per_s']['eager']:.0f} | {row['images_per_s']['compiled']:.0f} "
              f"| {row['speed_ratio']:.2f} | {row['largest_relative_difference']:.2e} "
              f"| {row['first_step_over_tolerance'] or '—'} | {rounding} | {row.get('within_rounding', '—')} |")
    out = args.out or Path(__file__).parent / "results" / f"compile_curves-{spec.name}.json"
    write_result(out, {"study": spec.name, "overrides": args.overrides, "steps": args.steps, "warmup": args.warmup,
                       "tolerance": args.tolerance, "rows": rows, "environment": environment(device)})
    print(f"written: {out}")


if __name__ == "__main__":
    main()
