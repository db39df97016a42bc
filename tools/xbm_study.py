"""The cross-batch memory on emoji and icons (docs/studies/xbm.md; issue 55, item 1).

For each data set, the demo's run (``configs/demo-emoji.yaml``: Lite0 + GAP + binomial deviance, 64 px, P x K = 16 x 4,
validation every 50 steps; icons: ``data.spec=icons data.val_fraction=0.2``, its 290 training names' 20% for
validation as in ``configs/studies/icons-tuned.yaml``), shortened to 200 steps for a 2-core CPU shared with other work
(one thread: ``train.threads=1``), without a memory and with memories of two sizes (about a seventh and a half or more
of the training images), warm-up 50 steps, weight 1, the same seed. Every run trains with
``--no-test``: the memory size is chosen on validation only (the best validation checkpoint of each run, ranked as
``train.select_by`` ranks checkpoints: Recall@1, then MAP@R, then R-precision); then the test split is evaluated once,
for the chosen size and for the run without a memory.

    .venv/bin/python tools/xbm_study.py [--out runs/xbm] [--record docs/studies/xbm.json] [--data emoji,icons]
        [--seeds 1,2]

Run it again after a stop: finished runs are kept, an interrupted one resumes from its ``last`` checkpoint. Prints a
Markdown table and writes the record (every command, every run's validation figures, the two test evaluations).

``--seeds 1,2`` replicates instead (the seed-0 runs are neither trained nor read): for each seed S and data set, the
run without a memory and the run with the size the record chose on seed 0's validation (its ``chosen_size``; refused
when the record lacks it), each with ``train.seed=S`` added to the same command (the same data split: it is drawn
with ``data.val_seed``), in ``OUT/DATA/seed-S/none`` and ``OUT/DATA/seed-S/memory-SIZE``, resumable as above; the test
split is evaluated once for each. They go to ``record[DATA]["seeds"][S]`` (``runs`` and ``test``, shaped as seed 0's);
the seed-0 entries are left as they are. Then it prints, per data set, each seed's test Recall@1 and MAP@R without
and with the memory, their paired differences, and the mean difference with its standard deviation over the seeds.
The record is re-read and written under a lock (``RECORD.lock``), so that one process per data set can run at once.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from deepmetric.io.files import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "configs/demo-emoji.yaml"
STEPS, WARMUP = 200, 50
DATA = {
    "emoji": {"overrides": [], "sizes": [512, 2048]},  # of 3,675 training drawings
    "icons": {"overrides": ["data.spec=icons", "data.val_fraction=0.2"], "sizes": [256, 1024]},  # of ~1,370
}


def command(data: str, size: int, out: Path, seed: int | None = None) -> list[str]:
    """The ``deepmetric train`` command of one run (``train.seed`` added at the end for a replicate)."""
    memory = [f"loss.memory.size={size}", f"loss.memory.warmup_steps={WARMUP}"] if size else []
    replicate = [f"train.seed={seed}"] if seed is not None else []
    return ["deepmetric", "train", "--config", CONFIG, "--out", str(out), "--no-test", "--quiet",
            "eval.baseline=false", f"train.steps={STEPS}", "train.threads=1", *DATA[data]["overrides"], *memory,
            *replicate]


def last_state(out: Path) -> dict | None:
    from deepmetric.runs.checkpoint import load_checkpoint

    path = out / "checkpoints" / "last.safetensors"
    return load_checkpoint(path)[1] if path.is_file() else None


def train(data: str, size: int, out: Path, seed: int | None = None) -> dict:
    """Train (or resume, or keep) one run; its command, seconds of this session and best validation figures."""
    args = command(data, size, out, seed)
    state = last_state(out)
    seconds = None
    if state is None or state["step"] < STEPS:
        run_args = args + (["--resume"] if state is not None else [])
        run_args = [a for a in run_args if a not in ("--config", CONFIG)] if state is not None else run_args
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "deepmetric", *run_args[1:]], cwd=ROOT, check=True)
        seconds = round(time.perf_counter() - started, 1)
        state = last_state(out)
    best = state["best"]
    return {"command": shlex.join(args), "session_seconds": seconds, "best_step": best["step"],
            "val": best["metrics"], "key": best["key"]}


def test_figures(out: Path) -> dict:
    """The run's test figures: its ``metrics.json`` when evaluated already, else ``deepmetric evaluate RUN`` (the test
    split, once, with the run's best validation checkpoint)."""
    done = out / "metrics.json"
    if done.is_file():
        return json.loads(done.read_text())["metrics"]
    from deepmetric.workflows import evaluate_run

    return evaluate_run(out, progress=False)["metrics"]


def run_folder(size: int) -> str:
    """The folder name of the run with a memory of ``size`` rows (0: none)."""
    return f"memory-{size}" if size else "none"


def update_record(path: Path, change) -> dict:
    """Re-read the record, apply ``change(record)`` and write it back, under an exclusive lock on ``PATH.lock``.

    Each process changes only its own data set's entries, on the record as it is on disk at that moment, so two
    processes (one per data set) keep each other's entries; the write is atomic."""
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = json.loads(path.read_text()) if path.is_file() else {}
        change(record)
        atomic_write_text(path, json.dumps(record, indent=2) + "\n")
        return record


def parse_seeds(text: str) -> list[int]:
    """``1,2`` -> [1, 2]: distinct seeds other than 0 (seed 0 is the record's main measurement)."""
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SystemExit(f"--seeds takes integers separated by commas, e.g. 1,2; got {text!r}") from None
    if not seeds or 0 in seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise SystemExit(f"--seeds takes distinct positive integers (seed 0 is the record's own runs); got {text!r}")
    return seeds


def sweep(data: str, out_root: Path, record_path: Path) -> None:
    """Seed 0: the run without a memory and both sizes, the size chosen on validation, the two test evaluations."""
    runs = {}
    for size in [0, *DATA[data]["sizes"]]:
        out = out_root / data / run_folder(size)
        runs[size] = train(data, size, out)
        runs[size]["out"] = str(out)
    chosen = max(DATA[data]["sizes"], key=lambda s: runs[s]["key"])  # on validation only
    tests = {size: test_figures(Path(runs[size]["out"])) for size in (0, chosen)}

    def change(record: dict) -> None:
        entry = {"warmup_steps": WARMUP, "steps": STEPS, "runs": {str(k): v for k, v in runs.items()},
                 "chosen_size": chosen, "test": {str(k): v for k, v in tests.items()}}
        if "seeds" in record.get(data, {}):
            entry["seeds"] = record[data]["seeds"]  # the replicates stay
        record[data] = entry

    update_record(record_path, change)
    print(f"\n{data}: memory size chosen on validation: {chosen}\n")
    print("| memory | best val step | val R@1 | val MAP@R | test R@1 | test MAP@R |\n|---|---|---|---|---|---|")
    for size, run in runs.items():
        test = tests.get(size)
        shown = f"{100 * test['recall@1']:.2f} | {100 * test['map@r']:.2f}" if test else "— | —"
        print(f"| {size or 'none'} | {run['best_step']} | {100 * run['val']['recall@1']:.2f} | "
              f"{100 * run['val']['map@r']:.2f} | {shown} |")


def replicate(data: str, seed: int, chosen: int, out_root: Path, record_path: Path) -> None:
    """One more seed: the run without a memory and with the chosen size, trained, then the test split of each."""
    runs = {}
    for size in (0, chosen):
        out = out_root / data / f"seed-{seed}" / run_folder(size)
        runs[size] = train(data, size, out, seed)
        runs[size]["out"] = str(out)
    tests = {size: test_figures(Path(runs[size]["out"])) for size in (0, chosen)}

    def change(record: dict) -> None:
        record[data].setdefault("seeds", {})[str(seed)] = {"runs": {str(k): v for k, v in runs.items()},
                                                            "test": {str(k): v for k, v in tests.items()}}

    update_record(record_path, change)


def replicate_rows(entry: dict) -> list[tuple[int, dict, dict]]:
    """(seed, test without a memory, test with the chosen size) for seed 0 and every replicate in the record."""
    chosen = str(entry["chosen_size"])
    rows = [(0, entry["test"]["0"], entry["test"][chosen])]
    for seed, rep in sorted(entry.get("seeds", {}).items(), key=lambda item: int(item[0])):
        rows.append((int(seed), rep["test"]["0"], rep["test"][chosen]))
    return rows


def replicate_table(data: str, entry: dict) -> str:
    """Markdown: each seed's test R@1 and MAP@R without and with the memory, the paired differences, their mean
    and standard deviation over the seeds (sample, n - 1), in %."""
    rows = replicate_rows(entry)
    size = entry["chosen_size"]
    lines = [f"{data}, memory {size:,} (chosen on seed 0's validation), test, %:", "",
             "| seed | R@1 none | R@1 memory | Δ R@1 | MAP@R none | MAP@R memory | Δ MAP@R |",
             "|---|---|---|---|---|---|---|"]
    deltas: dict[str, list[float]] = {"recall@1": [], "map@r": []}
    for seed, none, memory in rows:
        cells = []
        for key in ("recall@1", "map@r"):
            delta = 100 * memory[key] - 100 * none[key]
            deltas[key].append(delta)
            cells.append(f"{100 * none[key]:.2f} | {100 * memory[key]:.2f} | {delta:+.2f}")
        lines.append(f"| {seed} | {cells[0]} | {cells[1]} |")
    n = len(rows)
    summary = []
    for key in ("recall@1", "map@r"):
        mean = statistics.mean(deltas[key])
        spread = f" ± {statistics.stdev(deltas[key]):.2f}" if n > 1 else ""
        summary.append(f"{mean:+.2f}{spread}")
    lines.append(f"| mean Δ ± std (n = {n}) | | | {summary[0]} | | | {summary[1]} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/xbm")
    parser.add_argument("--record", default="docs/studies/xbm.json")
    parser.add_argument("--data", default="emoji,icons")
    parser.add_argument("--seeds", default="", help="replicate seeds, e.g. 1,2 (default: none, the seed-0 sweep)")
    args = parser.parse_args()
    record_path = ROOT / args.record
    datas = args.data.split(",")
    if not args.seeds:
        for data in datas:
            sweep(data, Path(args.out), record_path)
        return
    seeds = parse_seeds(args.seeds)
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    for data in datas:
        if "chosen_size" not in record.get(data, {}):
            raise SystemExit(f"{record_path} has no chosen_size for {data}: replicates repeat the size chosen on "
                             f"seed 0's validation, so run the seed-0 sweep first (without --seeds)")
    for data in datas:
        for seed in seeds:
            replicate(data, seed, record[data]["chosen_size"], Path(args.out), record_path)
    record = json.loads(record_path.read_text())
    for data in datas:
        print("\n" + replicate_table(data, record[data]))


if __name__ == "__main__":
    main()
